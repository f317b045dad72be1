"""What a person looks at after a run: the committed figures, the demo, the figures of one run and
the synthetic data they are drawn from."""

from ..utils.lazy import lazy_modules

__getattr__, __dir__ = lazy_modules(__name__, __path__)
