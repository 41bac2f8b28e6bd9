"""The compiled hot loops (``statefun/_hotloops.c``), when they were built and are not off.

A C compiler at install time builds them; without one the install still succeeds and every
loop runs as Python (the same results: tests/unit/test_hot_loops.py runs both). Setting
``PYSTATEFUN_NO_EXTENSIONS=1`` turns them off, for a comparison or to rule them out.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from types import ModuleType

__all__ = ["NO_EXTENSIONS_VARIABLE", "hot_loops", "load_hot_loops"]

log = logging.getLogger(__name__)

NO_EXTENSIONS_VARIABLE = "PYSTATEFUN_NO_EXTENSIONS"


def load_hot_loops(environ: Mapping[str, str] | None = None) -> ModuleType | None:
    """The extension module, or None: not built here, or turned off."""
    environ = os.environ if environ is None else environ
    if environ.get(NO_EXTENSIONS_VARIABLE, "").strip().lower() in ("1", "true", "yes", "on"):
        return None
    try:
        from statefun import _hotloops
    except ImportError as exc:
        log.debug("the compiled hot loops are not built here (%s): Python loops instead", exc)
        return None
    return _hotloops


#: chosen once, at import: the hot paths bind their loop then
hot_loops = load_hot_loops()
