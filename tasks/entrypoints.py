"""Objects a spec names by "package.module:attribute": environments, filters, cluster classes.

One loader, so every such name fails the same way, with a message that says what to fix.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TypeVar

T = TypeVar("T")

# Users most often name a module that lives next to their spec; that directory is not
# searched (Python looks in sys.path: installed packages, PYTHONPATH, the script's directory).
_PATH_HINT = ("check that it is installed or on PYTHONPATH, here and where the actors run "
              "(the spec's directory is not on the path unless you add it)")


def load(name: str, builtins: Mapping[str, T], what: str) -> T:
    """The object `name` names: a key of `builtins`, or "package.module:attribute".

    Raises ValueError saying what could not be loaded and why; `what` says what kind of
    object it is ("environment", "filter", ...).
    """
    if name in builtins:
        return builtins[name]
    module_name, sep, attr = name.partition(":")
    if not sep or not module_name or not attr:
        known = f"a built-in ({', '.join(builtins)}) or " if builtins else ""
        raise ValueError(f'unknown {what} {name!r}: use {known}"package.module:attribute"')
    module = _import(module_name, name, what)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"cannot load {what} {name!r}: module {module_name!r} has no attribute "
                         f"{attr!r}") from None


def _import(module_name: str, name: str, what: str):
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is None or f"{module_name}.".startswith(f"{e.name}."):  # it, or its package
            raise ValueError(f"cannot import {what} {name!r}: no module named {e.name!r}; "
                             f"{_PATH_HINT}") from None
        # The module exists but needs another that is missing: installing that is the fix.
        raise ValueError(f"cannot import {what} {name!r}: module {module_name!r} needs {e.name!r}, "
                         f"which is not installed") from None
    except Exception as e:  # the user's module failed at import (SyntaxError, ...)
        raise ValueError(f"cannot import {what} {name!r}: importing module {module_name!r} raised "
                         f"{type(e).__name__}: {e}") from e
