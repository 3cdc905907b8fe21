"""Wire messages between roles: a versioned header and raw array payloads, no pickle.

Layout (little endian)::

    header   magic b"RB" | version u8 | op u8 | request_id u32 | n_arrays u16 | descriptor bytes u16
    per array: name_len u8 | name | dtype code u8 | ndim u8 | shape u32 * ndim | nbytes u64
    payload  each array's bytes, in order, each starting at an 8-byte aligned offset

Everything is an array, scalars are 0-d arrays; decoding returns zero-copy numpy views of the
received buffer. `decode` never trusts the sender: a wrong magic/version, an unknown op or dtype,
a shape that disagrees with nbytes, a truncated or oversize message all raise `WireError`, which a
server answers with an ERROR message and counts, and keeps serving.
"""

from __future__ import annotations

import enum
import math
import struct
from typing import Any, Mapping

import numpy as np

MAGIC = b"RB"
VERSION = 2  # 2: the header says how many bytes the array descriptors take
HEADER = struct.Struct("<2sBBIHH")
ARRAY_TAIL = struct.Struct("<BB")  # dtype code, ndim
NBYTES = struct.Struct("<Q")
MAX_ARRAYS = 64
MAX_NDIM = 8
MAX_MESSAGE_BYTES = 1 << 30


class Op(enum.IntEnum):
    INSERT = 1  # actor -> replay: transitions (+ priorities); reply OK with counts, weights version
    SAMPLE = 2  # learner -> replay (server placement): batch_size, beta; reply BATCH
    UPDATE_PRIORITIES = 3  # learner -> replay: indices, priorities (+ credit in-network); reply OK (server)
    PUBLISH_PARAMS = 4  # learner -> replay: weights + version
    FETCH_PARAMS = 5  # actor -> replay: have_version; reply PARAMS (or OK when nothing newer)
    STATS = 6  # anyone -> replay: reply STATS (a JSON document as a uint8 array)
    SHUTDOWN = 7
    OK = 8
    ERROR = 9  # reply: "message" uint8 array (utf-8)
    BATCH = 10  # replay -> learner: indices, weights, transitions (pulled or pushed)
    CREDIT = 11  # learner -> replay (in-network): how many batches it may push ahead
    PARAMS = 12
    HELLO = 13  # role introduces itself: role name, id
    BYE = 14  # role leaves: its final counters (JSON)


DTYPES = [np.dtype(t) for t in ("float32", "float64", "int64", "int32", "uint8", "bool", "int16", "uint16",
                                 "int8", "uint32", "uint64", "float16")]
DTYPE_CODE = {dt: code for code, dt in enumerate(DTYPES)}
# Messages on the data path repeat a few shapes: their descriptor bytes (encode) and parsed layouts
# (decode) are remembered, which halves the codec's cost. Bounded: cleared when full.
_CACHE_ENTRIES = 1024
_DESCRIPTORS: dict[tuple[str, np.dtype, tuple[int, ...]], bytes] = {}
_Layout = tuple[list[tuple[str, np.dtype, int, "tuple[int, ...] | None", int, int]], int]
_LAYOUTS: dict[tuple[int, bytes], _Layout] = {}
_PADDING = [b"\0" * n for n in range(8)]


class WireError(ValueError):
    """A message that is not a valid rlbench wire message."""


def encode(op: Op, arrays: Mapping[str, Any] | None = None, request_id: int = 0) -> list[Any]:
    """Parts to hand to `send(*parts)`: header bytes, then array buffers (no copy of the data)."""
    arrays = arrays or {}
    if len(arrays) > MAX_ARRAYS:
        raise WireError(f"too many arrays ({len(arrays)} > {MAX_ARRAYS})")
    descriptors = []
    payloads = []
    for name, value in arrays.items():
        array = value if type(value) is np.ndarray else np.asarray(value)
        if not array.flags.c_contiguous:  # (ascontiguousarray would turn 0-d scalars into 1-d)
            array = np.ascontiguousarray(array)
        descriptor = _DESCRIPTORS.get((name, array.dtype, array.shape))
        if descriptor is None:
            descriptor = _describe(name, array)
        descriptors.append(descriptor)
        payloads.append(array)
    block = b"".join(descriptors)
    parts: list[Any] = [HEADER.pack(MAGIC, VERSION, int(op), request_id & 0xFFFFFFFF, len(arrays), len(block)), block]
    offset = HEADER.size + len(block)
    for array in payloads:
        pad = -offset % 8  # every array starts 8-byte aligned, so the receiver can view it in place
        if pad:
            parts.append(_PADDING[pad])
            offset += pad
        if array.nbytes:
            parts.append(memoryview(array).cast("B") if array.ndim else array.tobytes())
            offset += array.nbytes
    return parts


def _describe(name: str, array: np.ndarray) -> bytes:
    """One array's descriptor bytes, remembered per (name, dtype, shape): the data path repeats them."""
    code = DTYPE_CODE.get(array.dtype)
    if code is None:
        raise WireError(f"array {name!r}: dtype {array.dtype} cannot travel on the wire")
    raw_name = name.encode()
    descriptor = (bytes([len(raw_name)]) + raw_name + ARRAY_TAIL.pack(code, array.ndim)
                  + struct.pack(f"<{array.ndim}I", *array.shape) + NBYTES.pack(array.nbytes))
    if len(_DESCRIPTORS) >= _CACHE_ENTRIES:
        _DESCRIPTORS.clear()
    _DESCRIPTORS[(name, array.dtype, array.shape)] = descriptor
    return descriptor


def decode(buffer: Any, *, max_bytes: int = MAX_MESSAGE_BYTES) -> tuple[Op, int, dict[str, np.ndarray]]:
    """(op, request_id, arrays) from one received message; arrays are views into `buffer`."""
    view = memoryview(buffer).cast("B")
    size = view.nbytes
    if size > max_bytes:
        raise WireError(f"oversize message: {size} bytes > {max_bytes}")
    if size < HEADER.size:
        raise WireError(f"truncated message: {size} bytes is shorter than the {HEADER.size}-byte header")
    magic, version, op_code, request_id, n_arrays, block_bytes = HEADER.unpack_from(view, 0)
    if magic != MAGIC:
        raise WireError("not an rlbench message (bad magic)")
    if version != VERSION:
        raise WireError(f"wire version {version} not supported (this side speaks {VERSION})")
    try:
        op = Op(op_code)
    except ValueError:
        raise WireError(f"unknown op {op_code}") from None
    if n_arrays > MAX_ARRAYS:
        raise WireError(f"too many arrays: {n_arrays}")
    if HEADER.size + block_bytes > size:
        raise WireError(f"truncated message: {size} bytes cannot hold its {block_bytes} bytes of array descriptors")
    key = (n_arrays, bytes(view[HEADER.size:HEADER.size + block_bytes]))
    layout = _LAYOUTS.get(key)
    if layout is None:
        layout = _layout(key[1], n_arrays)
    entries, end = layout
    if end != size:
        for name, _, _, _, offset, nbytes in entries:
            if offset + nbytes > size:
                raise WireError(f"truncated message: array {name!r} needs {nbytes} bytes at {offset}, message has {size}")
        raise WireError(f"{size - end} trailing bytes after the last array")
    arrays: dict[str, np.ndarray] = {}
    frombuffer = np.frombuffer
    for name, dtype, count, shape, offset, nbytes in entries:
        array = frombuffer(view, dtype=dtype, count=count, offset=offset)
        arrays[name] = array if shape is None else array.reshape(shape)
    return op, request_id, arrays


def _layout(block: bytes, n_arrays: int) -> _Layout:
    """Parse and check a descriptor block once; messages of the same shape reuse the result: each
    array's (name, dtype, count, shape or None when 1-d, offset, nbytes), and where the message ends."""
    offset = 0
    descriptors = []
    try:
        for _ in range(n_arrays):
            name_len = block[offset]
            raw_name = block[offset + 1: offset + 1 + name_len]
            if len(raw_name) != name_len:
                raise WireError("truncated or garbled array descriptors (a name runs past the block)")
            name = raw_name.decode()
            offset += 1 + name_len
            code, ndim = ARRAY_TAIL.unpack_from(block, offset)
            offset += ARRAY_TAIL.size
            if code >= len(DTYPES):
                raise WireError(f"array {name!r}: unknown dtype code {code}")
            if ndim > MAX_NDIM:
                raise WireError(f"array {name!r}: {ndim} dimensions")
            shape = struct.unpack_from(f"<{ndim}I", block, offset)
            offset += 4 * ndim
            (nbytes,) = NBYTES.unpack_from(block, offset)
            offset += NBYTES.size
            dtype = DTYPES[code]
            if math.prod(shape) * dtype.itemsize != nbytes:
                raise WireError(f"array {name!r}: shape {shape} of {dtype} does not make {nbytes} bytes")
            descriptors.append((name, dtype, shape, nbytes))
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise WireError(f"truncated or garbled array descriptors ({exc})") from None
    if offset != len(block):
        raise WireError(f"{len(block) - offset} stray bytes in the array descriptors")
    entries = []
    position = HEADER.size + len(block)
    for name, dtype, shape, nbytes in descriptors:
        position += -position % 8
        entries.append((name, dtype, nbytes // dtype.itemsize, None if len(shape) == 1 else shape, position, nbytes))
        position += nbytes
    layout = (entries, position)
    if len(_LAYOUTS) >= _CACHE_ENTRIES:
        _LAYOUTS.clear()
    _LAYOUTS[(n_arrays, block)] = layout
    return layout


def text(message: str) -> np.ndarray:
    return np.frombuffer(message.encode(), dtype=np.uint8)


def read_text(array: np.ndarray) -> str:
    return bytes(array).decode(errors="replace")


def json_array(document: Any) -> np.ndarray:
    """For control-plane documents (stats, final counters) — never the data path."""
    import json

    return text(json.dumps(document, default=float))


def read_json(array: np.ndarray) -> Any:
    import json

    return json.loads(read_text(array))
