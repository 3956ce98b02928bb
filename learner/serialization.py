"""Parameters as bytes and back: the format weights travel in from the learner to the actors.

safetensors (a flat table of named arrays, no pickle: loading it runs no code) over the
parameters' pure nested dict, its keys joined with "/" (int keys, a list's entries,
written as digits).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from safetensors.numpy import load, save

SEPARATOR = "/"


def params_to_bytes(params: dict[str, Any]) -> bytes:
    """The host (NumPy) parameter tree as safetensors bytes."""
    return save({SEPARATOR.join(path): np.ascontiguousarray(leaf) for path, leaf in _leaves(params)})


def params_from_bytes(data: bytes) -> dict[str, Any]:
    """The parameter tree `params_to_bytes` wrote."""
    tree: dict[str, Any] = {}
    for name, array in load(data).items():
        *parents, leaf = name.split(SEPARATOR)
        node = tree
        for key in parents:
            node = node.setdefault(_key(key), {})
        node[_key(leaf)] = array
    return tree


def _key(name: str) -> str | int:
    # The pure dict of an NNX module keys a list's entries (the blocks) by int.
    return int(name) if name.isdigit() else name


def _leaves(tree: dict[str, Any], prefix: tuple[str, ...] = ()):
    for key, value in tree.items():
        if SEPARATOR in str(key):
            raise ValueError(f"parameter name {key!r} contains {SEPARATOR!r}")
        if isinstance(value, dict):
            yield from _leaves(value, (*prefix, str(key)))
        else:
            yield (*prefix, str(key)), value
