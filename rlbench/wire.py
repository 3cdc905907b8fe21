"""Wire messages between roles: a versioned header and raw array payloads, no pickle.

Layout (little endian)::

    header   magic b"RB" | version u8 | op u8 | request_id u32 | n_arrays u16 | reserved u16
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
VERSION = 1
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


class WireError(ValueError):
    """A message that is not a valid rlbench wire message."""


def encode(op: Op, arrays: Mapping[str, Any] | None = None, request_id: int = 0) -> list[Any]:
    """Parts to hand to `send(*parts)`: header bytes, then array buffers (no copy of the data)."""
    arrays = arrays or {}
    if len(arrays) > MAX_ARRAYS:
        raise WireError(f"too many arrays ({len(arrays)} > {MAX_ARRAYS})")
    head = bytearray(HEADER.pack(MAGIC, VERSION, int(op), request_id & 0xFFFFFFFF, len(arrays), 0))
    payloads = []
    for name, value in arrays.items():
        array = np.asarray(value)
        if not array.flags.c_contiguous:  # (ascontiguousarray would turn 0-d scalars into 1-d)
            array = np.ascontiguousarray(array)
        code = DTYPE_CODE.get(array.dtype)
        if code is None:
            raise WireError(f"array {name!r}: dtype {array.dtype} cannot travel on the wire")
        raw_name = name.encode()
        head += bytes([len(raw_name)]) + raw_name + ARRAY_TAIL.pack(code, array.ndim)
        head += struct.pack(f"<{array.ndim}I", *array.shape) + NBYTES.pack(array.nbytes)
        payloads.append(array)
    parts: list[Any] = [bytes(head)]
    offset = len(head)
    for array in payloads:
        pad = -offset % 8  # every array starts 8-byte aligned, so the receiver can view it in place
        if pad:
            parts.append(b"\0" * pad)
            offset += pad
        if array.nbytes:
            parts.append(memoryview(array).cast("B") if array.ndim else array.tobytes())
            offset += array.nbytes
    return parts


def decode(buffer: Any, *, max_bytes: int = MAX_MESSAGE_BYTES) -> tuple[Op, int, dict[str, np.ndarray]]:
    """(op, request_id, arrays) from one received message; arrays are views into `buffer`."""
    view = memoryview(buffer).cast("B")
    size = view.nbytes
    if size > max_bytes:
        raise WireError(f"oversize message: {size} bytes > {max_bytes}")
    if size < HEADER.size:
        raise WireError(f"truncated message: {size} bytes is shorter than the {HEADER.size}-byte header")
    magic, version, op_code, request_id, n_arrays, _ = HEADER.unpack_from(view, 0)
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
    offset = HEADER.size
    descriptors = []
    try:
        for _ in range(n_arrays):
            name_len = view[offset]
            name = bytes(view[offset + 1: offset + 1 + name_len]).decode()
            offset += 1 + name_len
            code, ndim = ARRAY_TAIL.unpack_from(view, offset)
            offset += ARRAY_TAIL.size
            if code >= len(DTYPES):
                raise WireError(f"array {name!r}: unknown dtype code {code}")
            if ndim > MAX_NDIM:
                raise WireError(f"array {name!r}: {ndim} dimensions")
            shape = struct.unpack_from(f"<{ndim}I", view, offset)
            offset += 4 * ndim
            (nbytes,) = NBYTES.unpack_from(view, offset)
            offset += NBYTES.size
            dtype = DTYPES[code]
            if math.prod(shape) * dtype.itemsize != nbytes:
                raise WireError(f"array {name!r}: shape {shape} of {dtype} does not make {nbytes} bytes")
            descriptors.append((name, dtype, shape, nbytes))
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise WireError(f"truncated or garbled array descriptors ({exc})") from None
    arrays: dict[str, np.ndarray] = {}
    for name, dtype, shape, nbytes in descriptors:
        offset += -offset % 8
        if offset + nbytes > size:
            raise WireError(f"truncated message: array {name!r} needs {nbytes} bytes at {offset}, message has {size}")
        array = np.frombuffer(view, dtype=dtype, count=nbytes // dtype.itemsize, offset=offset)
        arrays[name] = array if len(shape) == 1 else array.reshape(shape)
        offset += nbytes
    if offset != size:
        raise WireError(f"{size - offset} trailing bytes after the last array")
    return op, request_id, arrays


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
