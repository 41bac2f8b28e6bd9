"""Loading user code named by ``package.module:attribute`` or ``path/to/file.py:attribute``."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from statefun._exceptions import ConfigurationError

__all__ = ["ImportTargetError", "load_object"]

log = logging.getLogger(__name__)


class ImportTargetError(ConfigurationError):
    """A TARGET that cannot be imported; the message says why in one line."""


def _failure(module_name: str, exc: BaseException) -> str:
    message = " ".join(str(exc).split())
    kind = type(exc).__name__
    detail = f"{kind}: {message}" if message else kind
    return f"importing {module_name!r} failed: {detail} (--log-level debug shows the traceback)"


def _import_file(path: Path) -> Any:
    name = f"_statefun_user_{abs(hash(str(path.resolve())))}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportTargetError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    # Let the file import its neighbours.
    folder = str(path.parent.resolve())
    if folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        log.debug("importing %s failed", path, exc_info=True)
        raise ImportTargetError(_failure(str(path), exc)) from None
    return module


def load_object(target: str, base_dirs: Sequence[Path] = ()) -> Any:
    """The object named by ``target``.

    ``package.module:attribute`` is imported with the current directory and ``base_dirs`` on
    the path; ``some/file.py:attribute`` is loaded from that file, relative to the first of
    ``base_dirs`` (the folder of the module.yaml that names it) or the current directory.
    """
    module_name, sep, attribute = target.rpartition(":")
    if not sep or not module_name or not attribute:
        raise ImportTargetError(
            f"{target!r} must look like package.module:attribute or path/file.py:attribute"
        )
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_absolute():
            path = (base_dirs[0] if base_dirs else Path.cwd()) / path
        if not path.is_file():
            raise ImportTargetError(f"no such file {path} (from {target!r})")
        module = _import_file(path)
    else:
        for folder in [os.getcwd(), *(str(d) for d in base_dirs)]:
            if folder not in sys.path:
                sys.path.insert(0, folder)
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            missing = exc.name or ""
            if missing == module_name or module_name.startswith(missing + "."):
                raise ImportTargetError(
                    f"module {module_name!r} not found (looked in {os.getcwd()} and on sys.path)"
                ) from None
            log.debug("importing %s failed", module_name, exc_info=True)
            raise ImportTargetError(_failure(module_name, exc)) from None
        except Exception as exc:
            log.debug("importing %s failed", module_name, exc_info=True)
            raise ImportTargetError(_failure(module_name, exc)) from None
    obj: Any = module
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ImportTargetError(
                f"module {module_name!r} has no attribute {attribute!r}"
            ) from None
    return obj
