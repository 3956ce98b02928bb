"""Parameters as bytes and back: the format weights travel in from the learner to the actors.

safetensors (a flat table of named arrays, no pickle: loading it runs no code) over the
parameters' pure nested dict, its keys joined with "/" (int keys, a list's entries,
written as digits). Written and read here rather than by the `safetensors` package, whose
NumPy functions copy every array twice on the way out and once on the way in (a 1B
float32 model: 8.9 s to write, 7.9 s to read, BENCHMARKS.md): here the learner sends each
array from its own memory after a small header (`params_to_chunks`, no copy), and a
reader's arrays are read-only views of the bytes it received (no copy).
The layout is the format's: an 8-byte little-endian header length, a JSON header (each
array's dtype, shape and byte range) padded to 8 bytes, then the arrays' bytes.
"""

from __future__ import annotations

import json
from typing import Any

import ml_dtypes
import numpy as np

SEPARATOR = "/"
_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
           "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
_NAMES = {np.dtype(dtype): name for name, dtype in _DTYPES.items()}


def params_to_chunks(params: dict[str, Any]) -> list[memoryview]:
    """The host (NumPy) parameter tree in safetensors layout, as the buffers to send in
    order: the header, then each array's own memory (no copy; the arrays must not change
    while the chunks are in use)."""
    arrays = {SEPARATOR.join(path): np.ascontiguousarray(leaf) for path, leaf in _leaves(params)}
    header, offset = {}, 0
    for name, array in arrays.items():
        header[name] = {"dtype": _NAMES[array.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the format aligns the arrays to 8 bytes
    return [memoryview(len(head).to_bytes(8, "little") + head)] + [
        memoryview(array.reshape(-1).view(np.uint8)) for array in arrays.values()]


def params_to_bytes(params: dict[str, Any]) -> bytes:
    """The same as one bytes object (one copy of the parameters)."""
    return b"".join(params_to_chunks(params))


def params_from_bytes(data: bytes) -> dict[str, Any]:
    """The parameter tree `params_to_bytes` wrote (any safetensors bytes of these dtypes),
    as read-only views of `data`."""
    length = int.from_bytes(data[:8], "little")
    header = json.loads(bytes(data[8:8 + length]))
    header.pop("__metadata__", None)
    tree: dict[str, Any] = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        dtype = np.dtype(_DTYPES[entry["dtype"]])
        array = np.frombuffer(data, dtype, count=(end - begin) // dtype.itemsize, offset=8 + length + begin)
        *parents, leaf = name.split(SEPARATOR)
        node = tree
        for key in parents:
            node = node.setdefault(_key(key), {})
        node[_key(leaf)] = array.reshape(entry["shape"])
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
