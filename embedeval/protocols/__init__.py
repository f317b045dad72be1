"""Who is compared with whom: face verification and open-set identification, person
re-identification, landmark retrieval (revisited Oxford / Paris) and judged-relevance retrieval."""

from ..utils.lazy import lazy_modules

__getattr__, __dir__ = lazy_modules(
    __name__,
    (
        "landmarks",
        "qrels",
        "reid",
        "verification",
    ),
)
