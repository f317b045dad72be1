"""pytest collection settings shared by the test suite and the package's doctests."""

import importlib.util

# The Lightning integration imports Lightning at module level (its callback subclasses
# Lightning's); without the optional package its doctests cannot be collected.
collect_ignore = []
if (
    importlib.util.find_spec("lightning") is None
    and importlib.util.find_spec("pytorch_lightning") is None
):
    collect_ignore.append("embedeval/integrations/lightning.py")
