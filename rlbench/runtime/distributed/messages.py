"""The wire: every message rlbench's roles exchange, in one place — framing, ops, what each op
carries and answers, the transition layout, the weights encoding, STATUS, and authentication.
Nothing else in rlbench spells an op, a field name or a byte of the format.

Framing
-------
A message is one transport message (the transport delimits it). Little endian::

    header (12 bytes)  magic b"RB" | version u8 | op u8 | request_id u32 | n_arrays u16 | descriptor_bytes u16
    descriptors        per array: name_len u8 | name (utf-8) | dtype code u8 | ndim u8 | shape u32 * ndim | nbytes u64
    payload            each array's bytes in descriptor order, each starting at an 8-byte aligned
                       offset from the start of the message (zero padding between)

Everything is a named array; a scalar is a 0-d array, text is a uint8 array of utf-8. dtype codes
index DTYPES below. At most MAX_ARRAYS arrays of at most MAX_NDIM dimensions. A request carries a
non-zero request_id and its reply the same id; one-way messages and pushes carry 0. Decoding
returns zero-copy numpy views of the received buffer, valid until the transport's next receive.

Versions: 1 first; 2 the header says how many bytes the descriptors take; 3 (this) authentication
(HELLO/CHALLENGE/AUTH/WELCOME), STATUS is its own operation and no reply carries status fields any
more, END ends a stream of batches, ops renumbered. A peer speaking another version is answered
ERROR "wire version X not supported (this side speaks 3)".

Validation
----------
`decode` never trusts the sender. It refuses, as `WireError`, a wrong magic/version, an unknown op
or dtype, a shape that disagrees with nbytes, truncation, trailing bytes, an oversize message, and
anything that breaks the op's schema (SCHEMAS): an array the op does not carry or lacks, a wrong
dtype kind or number of dimensions, rows of different lengths, a scalar out of its range, text
that is not short utf-8, JSON that is not a small object. Structure is checked once per
(op, descriptor block) and remembered; per message only the scalars' values (and the text/JSON
bodies) are read. A server answers any WireError with ERROR and keeps serving.

Native codec
------------
`encode` and `decode` are rlbench._wire's C codec when it is built (NATIVE; NATIVE_REASON says why
not), built here from this module's own definitions: the C code implements the framing of HEADER,
ARRAY_TAIL and NBYTES (it refuses to start if they differ), asks `_native_layout` to check each new
descriptor block against SCHEMAS (and remembers the answer), checks the scalars' ranges itself, and
hands everything else to `python_encode` / `python_decode`, which accept it or raise their WireError:
the same messages, the same bytes, the same errors. tests/test_fast_path.py compares the two.

Ops (request -> reply; "one-way" has no reply; "push" is sent by the node, request_id 0)
--------------------------------------------------------------------------------------
=================  ============================================================  ==================
HELLO              role text (actor | learner | launcher), index i64, nonce u8[16]  -> CHALLENGE, or
                                                                                  WELCOME when the
                                                                                  node runs without
                                                                                  a secret
CHALLENGE          nonce u8[16], proof u8[32] = HMAC(key, "node" + client nonce + nonce)
AUTH               proof u8[32] = HMAC(key, "role" + role + index + node nonce + client nonce)
                                                                              -> WELCOME or ERROR
WELCOME            (nothing)
INSERT             obs, action, reward, next_obs, done (rows), produced i64 (= rows: the
                   node counts what it stores), priorities f64[rows] (optional)  -> INSERTED
                   An image run's (transitions.frames_of(spec) = k > 0) carries each frame once:
                   frames (m, *frame) and obs_frames, next_obs_frames (rows, k) integer
                   indices into frames, instead of obs and next_obs (see "Frames" below)
INSERTED           produced i64, params_version i64, learner_updates i64, finished u8: what an
                   actor needs to pace itself and know when newer weights exist
SAMPLE             batch_size i64, beta f64                                 -> BATCH or END
BATCH              indices i64[B], weights f32[B], obs, action, reward, next_obs, done (rows),
                   step i64 (env steps produced when it was drawn, for beta annealing); also a push.
                   Drawn from a memory of frames: stacks (rows, k + 1, *frame) instead of obs
                   and next_obs, which are its frames [0, k) and [1, k + 1) (see "Frames")
END                finished u8 = 1: the run is over (reply to SAMPLE, or a push)
UPDATE_PRIORITIES  indices i64[n], priorities f64[n], learner_updates i64,
                   credit i64, beta f64 (in-network, optional)              one-way
CREDIT             credit i64, beta f64                                     one-way (in-network)
PUBLISH_PARAMS     version i64, w0 .. wK f32                                one-way
FETCH_PARAMS       have_version i64                                         -> PARAMS or CURRENT
PARAMS             version i64, w0 .. wK f32
CURRENT            finished u8: nothing newer than have_version
STATUS             (nothing)                                                -> STATE
STATE              finished u8, produced i64, stored i64, params_version i64, learner_updates i64,
                   actors i64 (connected), done_reason text
STATS              (nothing)                                                -> REPORT
REPORT             json u8[]: the node's report (a JSON object)
BYE                report u8[] (a JSON object: the role's final counters)   -> OK
FINISH             reason text: end the run now (actors see finished, the learner END); the node
                   keeps taking last inserts, goodbyes and STATS until SHUTDOWN  -> OK
SHUTDOWN           (nothing): stop serving                                  -> OK
OK                 (nothing)
ERROR              message text
=================  ============================================================  ==================

Transition rows: obs and next_obs share a shape (rows, *observation) of any numeric dtype (an
image's uint8 stays uint8: the learner's device casts it); action is (rows,) integer or (rows,
*action) real; reward (rows,) real; done (rows,) real or bool. A run fixes the exact layout from its
environment's spec (rlbench.runtime.transitions, where the fields are named once): actors send it,
and the replay node refuses any other, so the first writer cannot impose its own.

Frames: an observation of an image run is k frames stacked on axis 0 (k = 1: the whole observation
is one frame), and consecutive stacks share k - 1 of them, next_obs its row's obs k - 1 and the next
row's obs all k. A stacked INSERT of 128 Atari transitions (4 x 84 x 84 uint8) is 7.2 MB of which
~0.9 MB is distinct, so an actor sends each distinct frame once (`framed`, built with
rlbench.kit.frames.pack): frames (m, *frame) of the observations' dtype, and per row the indices of
its obs's and its next_obs's k frames, obs_frames and next_obs_frames (rows, k). An INSERT carries
either obs and next_obs or the three frame arrays, never both. The replay node refuses indices
outside frames and a k other than its run's (`frames_problem`), then hands the frames as they came
to a memory that stores frames (the core's) or the stacks rebuilt exactly (`stacked`) to any other.
A BATCH is not packed: the rows of a sample share few frames across rows (158 distinct of 256 for
32 Atari transitions, measured), and packing them (~0.5 ms at the node, 0.1 ms to unpack) costs
about what the 38 % fewer bytes save on shm, dpdk or tcp at 1.5-10 GB/s. Within a row, though,
next_obs is obs shifted by one frame, and a memory of frames samples the two as views of one
(rows, k + 1, *frame) array (`shifted_stacks`): the node sends that array, `stacks` (1.1 MB instead
of 1.8 MB, and no copy to make the views contiguous), and the learner's obs and next_obs are views
of it again (`unshifted`). Any other pair travels as obs and next_obs.

Versions and frames: the framed INSERT and the BATCH of stacks are additive (version 3 still): every
message of a peer without them means what it meant, and such a peer answers one of them with
ERROR "... lacks obs, next_obs", which names the cause. A version bump would refuse every other
message between such peers too, which nothing here calls for: a run's roles run one rlbench.

Weights: PARAMS and PUBLISH_PARAMS carry the policy's arrays as w0, w1, ... in order
([W0, b0, W1, b1, ...], W of shape (in, out)), float32; `weights_arrays` and `read_weights`.

Keys: the launcher draws the run's secret; the replay node holds it, and every other role holds
only its own key, `role_key(secret, role, index)` = HMAC(secret, "key" + role + index). A role
proves its key, so it can authenticate as itself and nothing else: an actor cannot open a
connection as the launcher.

Who may send what (ALLOWED_ROLES): only an authenticated peer sends anything but HELLO/AUTH;
actors INSERT; the learner SAMPLEs, updates priorities and credit; the learner and the launcher
PUBLISH_PARAMS; STATS, FINISH and SHUTDOWN are the launcher's; CHECKPOINT is learner 0's.
"""

from __future__ import annotations

import enum
import hmac
import json
import math
import struct
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

MAGIC = b"RB"
VERSION = 3
HEADER = struct.Struct("<2sBBIHH")
ARRAY_TAIL = struct.Struct("<BB")  # dtype code, ndim
NBYTES = struct.Struct("<Q")
MAX_ARRAYS = 64
MAX_NDIM = 8
MAX_MESSAGE_BYTES = 1 << 30
NONCE_BYTES = 16
PROOF_BYTES = 32  # HMAC-SHA256


class Op(enum.IntEnum):
    HELLO = 1
    CHALLENGE = 2
    AUTH = 3
    WELCOME = 4
    INSERT = 5
    INSERTED = 6
    SAMPLE = 7
    BATCH = 8
    END = 9
    UPDATE_PRIORITIES = 10
    CREDIT = 11
    PUBLISH_PARAMS = 12
    FETCH_PARAMS = 13
    PARAMS = 14
    CURRENT = 15
    STATUS = 16
    STATE = 17
    STATS = 18
    REPORT = 19
    BYE = 20
    SHUTDOWN = 21
    OK = 22
    ERROR = 23
    FINISH = 24
    CHECKPOINT = 25


ROLES = ("actor", "learner", "launcher")


def role_name(role: str, index: int) -> str:
    """How a role is called in reports: actor-i, learner (learner 0) and learner-i, launcher, replay."""
    return f"{role}-{index}" if role == "actor" or index else role
STATE_FIELDS = ("finished", "produced", "stored", "params_version", "learner_updates", "actors")
ALLOWED_ROLES: dict[Op, frozenset[str]] = {
    Op.INSERT: frozenset({"actor"}),
    Op.SAMPLE: frozenset({"learner"}),
    Op.UPDATE_PRIORITIES: frozenset({"learner"}),
    Op.CREDIT: frozenset({"learner"}),
    Op.PUBLISH_PARAMS: frozenset({"learner", "launcher"}),
    Op.FETCH_PARAMS: frozenset(ROLES),
    Op.STATUS: frozenset(ROLES),
    Op.STATS: frozenset({"launcher"}),
    Op.BYE: frozenset({"actor", "learner"}),
    Op.SHUTDOWN: frozenset({"launcher"}),
    Op.FINISH: frozenset({"launcher"}),
    Op.CHECKPOINT: frozenset({"learner"}),  # learner 0's only: the node checks the index
}

# Bounds a well-behaved peer never comes near; a value outside is an error, not a 2**40-row request.
MAX_ROWS = 1 << 20  # rows in one INSERT or BATCH, indices in one update
MAX_BATCH = 1 << 16  # SAMPLE batch size
MAX_COUNT = 1 << 53  # counters (produced, versions, updates): exact in a float64 too
MAX_CREDIT = 1 << 10
MAX_INDEX = 1 << 30  # actor index
MAX_TEXT = 256
MAX_JSON = 4 << 20

DTYPES = [np.dtype(t) for t in ("float32", "float64", "int64", "int32", "uint8", "bool", "int16", "uint16",
                                 "int8", "uint32", "uint64", "float16")]
DTYPE_CODE = {dt: code for code, dt in enumerate(DTYPES)}


class WireError(ValueError):
    """A message that is not a valid rlbench message, or breaks its op's schema. `request_id` is the
    id to answer with when the header could be read (0 otherwise)."""

    def __init__(self, message: str, request_id: int = 0) -> None:
        super().__init__(message)
        self.request_id = request_id


# ------------------------------------------------------------------------------------------ schemas
@dataclass(frozen=True)
class Scalar:
    kinds: str  # numpy dtype kinds accepted: "i" signed, "u" unsigned, "f" real, "b" bool
    low: float
    high: float


@dataclass(frozen=True)
class Vector:
    """1-D; `rows` ties its length to the message's transition rows."""

    kinds: str
    max_len: int = MAX_ROWS
    rows: bool = False


@dataclass(frozen=True)
class Rows:
    """Leading axis = the message's transition rows; `ndim` None: at least 1. `shifted`: (rows, k + 1,
    *frame) with k >= 1, a row's observation and next observation in one (see "Frames")."""

    kinds: str
    ndim: int | None = None
    shifted: bool = False


@dataclass(frozen=True)
class Frames:
    """Distinct frames: a leading axis of their own (not the message's rows), then the frame's shape."""

    kinds: str
    max_len: int = MAX_ROWS


@dataclass(frozen=True)
class Text:
    max_bytes: int = MAX_TEXT


@dataclass(frozen=True)
class Json:
    max_bytes: int = MAX_JSON


@dataclass(frozen=True)
class Bytes:
    length: int


@dataclass(frozen=True)
class Schema:
    required: Mapping[str, Any]
    optional: Mapping[str, Any] = ()  # type: ignore[assignment]
    weights: bool = False  # w0, w1, ... of real dtype
    same_shape: tuple[tuple[str, ...], ...] = ()  # groups of arrays that must share a shape (obs, next_obs)
    either: tuple[tuple[str, ...], ...] = ()  # groups of optional arrays: exactly one group, whole, is carried


INT = "iu"
REAL = "f"
COUNT = Scalar(INT, 0, MAX_COUNT)
VERSION_NUMBER = Scalar(INT, -1, MAX_COUNT)
FLAG = Scalar(INT + "b", 0, 1)
MASS = Scalar(REAL, 0.0, math.inf)  # a sum of priorities**alpha, or the smallest (inf: none is non-zero)
OBSERVATION = INT + REAL + "b"  # any numeric dtype: the run's layout (checked by the node) fixes which
OBSERVATIONS = {"obs": Rows(OBSERVATION), "next_obs": Rows(OBSERVATION)}
FRAMED = {"frames": Frames(OBSERVATION), "obs_frames": Rows(INT, 2), "next_obs_frames": Rows(INT, 2)}
SHIFTED = {"stacks": Rows(OBSERVATION, shifted=True)}
OUTCOMES = {"action": Rows(INT + REAL), "reward": Rows(REAL, 1), "done": Rows(REAL + "b", 1)}
TRANSITIONS = {**OBSERVATIONS, **OUTCOMES}

SCHEMAS: dict[Op, Schema] = {
    Op.HELLO: Schema({"role": Text(), "index": Scalar(INT, 0, MAX_INDEX), "nonce": Bytes(NONCE_BYTES)}),
    Op.CHALLENGE: Schema({"nonce": Bytes(NONCE_BYTES), "proof": Bytes(PROOF_BYTES)}),
    Op.AUTH: Schema({"proof": Bytes(PROOF_BYTES)}),
    Op.WELCOME: Schema({}),
    # obs and next_obs, or (an image run's) each frame once and the indices that stack them
    Op.INSERT: Schema({**OUTCOMES, "produced": COUNT},
                      {**OBSERVATIONS, **FRAMED, "priorities": Vector(REAL, rows=True)},
                      same_shape=(("obs", "next_obs"), ("obs_frames", "next_obs_frames")),
                      either=(tuple(OBSERVATIONS), tuple(FRAMED))),
    Op.INSERTED: Schema({"produced": COUNT, "params_version": VERSION_NUMBER, "learner_updates": COUNT,
                         "finished": FLAG}),
    Op.SAMPLE: Schema({"batch_size": Scalar(INT, 1, MAX_BATCH), "beta": Scalar(REAL + INT, 0.0, 1.0)}),
    # a shard of several adds its memory's priority mass after the draw (rlbench/runtime/distributed/shards.py)
    # obs and next_obs, or (drawn from a memory of frames) each row's k + 1 frames that both are views of
    Op.BATCH: Schema({**OUTCOMES, "indices": Vector(INT, rows=True), "weights": Vector(REAL, rows=True),
                      "step": COUNT}, {**OBSERVATIONS, **SHIFTED, "mass": MASS, "min_mass": MASS},
                      same_shape=(("obs", "next_obs"),), either=(tuple(OBSERVATIONS), tuple(SHIFTED))),
    Op.END: Schema({"finished": FLAG}),
    Op.UPDATE_PRIORITIES: Schema({"indices": Vector(INT), "priorities": Vector(REAL), "learner_updates": COUNT},
                                 {"credit": Scalar(INT, 0, MAX_CREDIT), "beta": Scalar(REAL + INT, 0.0, 1.0)}),
    Op.CREDIT: Schema({"credit": Scalar(INT, 0, MAX_CREDIT), "beta": Scalar(REAL + INT, 0.0, 1.0)}),
    Op.PUBLISH_PARAMS: Schema({"version": COUNT}, weights=True),
    Op.FETCH_PARAMS: Schema({"have_version": VERSION_NUMBER}),
    Op.PARAMS: Schema({"version": COUNT}, weights=True),
    Op.CURRENT: Schema({"finished": FLAG}),
    Op.STATUS: Schema({}),
    Op.STATE: Schema({"finished": FLAG, "produced": COUNT, "stored": COUNT, "params_version": VERSION_NUMBER,
                      "learner_updates": COUNT, "actors": COUNT, "done_reason": Text(4096)}),
    Op.STATS: Schema({}),
    Op.REPORT: Schema({"json": Json()}),
    Op.BYE: Schema({"report": Json()}),
    Op.SHUTDOWN: Schema({}),
    Op.OK: Schema({}),
    Op.ERROR: Schema({"message": Text(65536)}),
    Op.FINISH: Schema({"reason": Text(4096)}),
    # a checkpoint's number only: where it goes is the node's own setting (rlbench/runtime/checkpoint.py)
    Op.CHECKPOINT: Schema({"number": COUNT}),
}
assert set(SCHEMAS) == set(Op)


# ------------------------------------------------------------------------------------------- encode
# The data path repeats a few shapes: descriptor bytes (encode) and checked layouts (decode) are
# remembered, which halves the codec's cost. Bounded: cleared when full.
_CACHE_ENTRIES = 1024
_DESCRIPTORS: dict[tuple[str, np.dtype, tuple[int, ...]], bytes] = {}
_PADDING = [b"\0" * n for n in range(8)]


def python_encode(op: Op, arrays: Mapping[str, Any] | None = None, request_id: int = 0) -> list[Any]:
    """Parts to hand to `send(*parts)`: header bytes, then array buffers (no copy of the data).
    (`encode` is this, or the native codec: a small message as one bytes part.)"""
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
    """One array's descriptor bytes, remembered per (name, dtype, shape)."""
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


def encoded_bytes(op: Op, arrays: Mapping[str, Any] | None = None) -> int:
    """The bytes of a message of `arrays` on the wire (header, descriptors, padding, data), without encoding it."""
    return sum(memoryview(part).nbytes for part in python_encode(op, arrays))


def joined(parts: Sequence[Any]) -> bytes:
    """One bytes object of an encoded message (for a retry, or a test)."""
    return b"".join(p if isinstance(p, bytes) else bytes(memoryview(p).cast("B")) for p in parts)


# ------------------------------------------------------------------------------------------- decode
# A checked layout: each array's (name, dtype, count, shape or None when 1-d, offset, nbytes), where
# the message ends, and the values to check per message (scalars with ranges, text, json).
_Entry = tuple[str, np.dtype, int, "tuple[int, ...] | None", int, int]
_Layout = tuple[list[_Entry], int, tuple[tuple[str, Any], ...]]
_LAYOUTS: dict[tuple[int, int, bytes], _Layout] = {}


def python_decode(buffer: Any, *, max_bytes: int = MAX_MESSAGE_BYTES) -> tuple[Op, int, dict[str, np.ndarray]]:
    """(op, request_id, arrays) of one received message, checked against its op's schema; arrays are
    views into `buffer`. Raises WireError (see the module's notes). (`decode` is this or the native codec.)"""
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
        raise WireError(f"wire version {version} not supported (this side speaks {VERSION})", request_id)
    if HEADER.size + block_bytes > size:
        raise WireError(f"truncated message: {size} bytes cannot hold its {block_bytes} bytes of array descriptors",
                        request_id)
    key = (op_code, n_arrays, bytes(view[HEADER.size:HEADER.size + block_bytes]))
    layout = _LAYOUTS.get(key)
    if layout is None:
        layout = _checked_layout(key, request_id)
    entries, end, values = layout
    if end != size:
        for name, _, _, _, offset, nbytes in entries:
            if offset + nbytes > size:
                raise WireError(f"truncated message: array {name!r} needs {nbytes} bytes at {offset}, message has {size}",
                                request_id)
        raise WireError(f"{size - end} trailing bytes after the last array", request_id)
    arrays: dict[str, np.ndarray] = {}
    frombuffer = np.frombuffer
    for name, dtype, count, shape, offset, nbytes in entries:
        array = frombuffer(view, dtype=dtype, count=count, offset=offset)
        arrays[name] = array if shape is None else array.reshape(shape)
    op = Op(op_code)  # known: the layout check refused unknown ops
    for name, spec in values:
        _check_value(op, name, spec, arrays[name], request_id)
    return op, request_id, arrays


def _check_value(op: Op, name: str, spec: Any, array: np.ndarray, request_id: int) -> None:
    if isinstance(spec, Scalar):
        value = array.item()
        if not (spec.low <= value <= spec.high):  # NaN fails too
            raise WireError(f"{op.name}: {name} = {value!r} is outside [{spec.low:g}, {spec.high:g}]", request_id)
    elif isinstance(spec, Text):
        try:
            array.tobytes().decode()
        except UnicodeDecodeError:
            raise WireError(f"{op.name}: {name} is not utf-8 text", request_id) from None
    elif isinstance(spec, Json):
        try:
            document = json.loads(array.tobytes())
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise WireError(f"{op.name}: {name} is not JSON", request_id) from None
        if not isinstance(document, dict):
            raise WireError(f"{op.name}: {name} must be a JSON object, got {type(document).__name__}", request_id)


def _parse_descriptors(block: bytes, n_arrays: int) -> list[tuple[str, np.dtype, tuple[int, ...], int]]:
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
    return descriptors


def _checked_layout(key: tuple[int, int, bytes], request_id: int) -> _Layout:
    """Parse a descriptor block and check it against the op's schema, once per distinct block."""
    op_code, n_arrays, block = key
    try:
        op = Op(op_code)
    except ValueError:
        raise WireError(f"unknown op {op_code}", request_id) from None
    if n_arrays > MAX_ARRAYS:
        raise WireError(f"too many arrays: {n_arrays}", request_id)
    try:
        descriptors = _parse_descriptors(block, n_arrays)
        values = _check_schema(op, SCHEMAS[op], {name: (dtype, shape) for name, dtype, shape, _ in descriptors})
    except WireError as exc:
        raise WireError(str(exc), request_id) from None
    if len({d[0] for d in descriptors}) != len(descriptors):
        raise WireError(f"{op.name}: an array name appears twice", request_id)
    entries = []
    position = HEADER.size + len(block)
    for name, dtype, shape, nbytes in descriptors:
        position += -position % 8
        entries.append((name, dtype, nbytes // dtype.itemsize, None if len(shape) == 1 else shape, position, nbytes))
        position += nbytes
    layout = (entries, position, values)
    if len(_LAYOUTS) >= _CACHE_ENTRIES:
        _LAYOUTS.clear()
    _LAYOUTS[key] = layout
    return layout


def _check_schema(op: Op, schema: Schema, arrays: dict[str, tuple[np.dtype, tuple[int, ...]]]) -> tuple[tuple[str, Any], ...]:
    """Refuse a layout that breaks the op's schema; the per-message value checks it needs."""
    specs = {**schema.required, **dict(schema.optional)}
    missing = [name for name in schema.required if name not in arrays]
    if missing:
        raise WireError(f"{op.name} lacks {', '.join(missing)}")
    if schema.either:
        carried = [group for group in schema.either if any(name in arrays for name in group)]
        if not carried:
            first, *others = (", ".join(group) for group in schema.either)
            raise WireError(f"{op.name} lacks {first} (or {'; or '.join(others)})")
        if len(carried) > 1:
            raise WireError(f"{op.name} carries {' and '.join(group[0] for group in carried)}: one of them only")
        absent = [name for name in carried[0] if name not in arrays]
        if absent:
            raise WireError(f"{op.name} lacks {', '.join(absent)}")
    rows: int | None = None
    values: list[tuple[str, Any]] = []
    for name, (dtype, shape) in arrays.items():
        spec = specs.get(name)
        if spec is None and schema.weights and name[:1] == "w" and name[1:].isdigit():
            if not shape or dtype.kind != "f":
                raise WireError(f"{op.name}: weight array {name} must be a real array, got {dtype}{list(shape)}")
            continue
        if spec is None:
            raise WireError(f"{op.name} carries no array named {name!r}")
        kind = dtype.kind
        if isinstance(spec, Scalar):
            if shape or kind not in spec.kinds:
                raise WireError(f"{op.name}: {name} must be a scalar of kind {spec.kinds!r}, got {dtype}{list(shape)}")
            values.append((name, spec))
        elif isinstance(spec, Frames):
            if kind not in spec.kinds or len(shape) < 2:
                raise WireError(f"{op.name}: {name} must be frames (count, *frame) of kind {spec.kinds!r}, got "
                                f"{dtype}{list(shape)}")
            if shape[0] > spec.max_len:
                raise WireError(f"{op.name}: {name} has {shape[0]} frames (at most {spec.max_len})")
        elif isinstance(spec, (Text, Json, Bytes)):
            if dtype != np.uint8 or len(shape) != 1:
                raise WireError(f"{op.name}: {name} must be a 1-D uint8 array, got {dtype}{list(shape)}")
            limit = spec.length if isinstance(spec, Bytes) else spec.max_bytes
            if shape[0] > limit or (isinstance(spec, Bytes) and shape[0] != limit):
                raise WireError(f"{op.name}: {name} has {shape[0]} bytes (allowed: {limit})")
            if not isinstance(spec, Bytes):
                values.append((name, spec))
        else:  # Vector, Rows
            if kind not in spec.kinds:
                raise WireError(f"{op.name}: {name} has dtype {dtype}, expected kind {spec.kinds!r}")
            if isinstance(spec, Vector) and len(shape) != 1:
                raise WireError(f"{op.name}: {name} must be 1-D, got shape {list(shape)}")
            if isinstance(spec, Rows) and (not shape or (spec.ndim is not None and len(shape) != spec.ndim)):
                raise WireError(f"{op.name}: {name} has shape {list(shape)}, expected "
                                + (f"{spec.ndim} dimension(s)" if spec.ndim else "a leading row axis"))
            if isinstance(spec, Rows) and spec.shifted and (len(shape) < 3 or shape[1] < 2):
                raise WireError(f"{op.name}: {name} has shape {list(shape)}, expected (rows, k + 1, *frame), "
                                "k >= 1")
            if isinstance(spec, Vector) and shape[0] > spec.max_len:
                raise WireError(f"{op.name}: {name} has {shape[0]} entries (at most {spec.max_len})")
            if isinstance(spec, Rows) or spec.rows:
                if rows is None:
                    rows = shape[0]
                elif shape[0] != rows:
                    raise WireError(f"{op.name}: {name} has {shape[0]} rows, other arrays {rows}")
    if rows is not None and not 1 <= rows <= MAX_ROWS:
        raise WireError(f"{op.name}: {rows} rows (1 to {MAX_ROWS} allowed)")
    if "indices" in arrays and "priorities" in arrays and arrays["indices"][1] != arrays["priorities"][1]:
        raise WireError(f"{op.name}: {arrays['indices'][1][0]} indices but {arrays['priorities'][1][0]} priorities")
    for group in schema.same_shape:
        if len({arrays[name][1] for name in group if name in arrays}) > 1:
            raise WireError(f"{op.name}: {' and '.join(group)} must have the same shape")
    return tuple(values)


# ----------------------------------------------------------------------------- typed helpers per op
def text(message: str) -> np.ndarray:
    return np.frombuffer(message.encode(), dtype=np.uint8)


def read_text(array: np.ndarray) -> str:
    return array.tobytes().decode(errors="replace")


def json_array(document: Any) -> np.ndarray:
    """For control-plane documents (reports, final counters) — never the data path."""
    return text(json.dumps(document, default=float))


def read_json(array: np.ndarray) -> Any:
    return json.loads(array.tobytes())


def with_request_id(message: bytes, request_id: int) -> list[Any]:
    """An encoded message's parts under another request id: a header of its own and the rest as it
    is (what a server sends many peers, such as the weights, is encoded once)."""
    magic, version, op, _, n_arrays, descriptor_bytes = HEADER.unpack_from(message)
    return [HEADER.pack(magic, version, op, request_id & 0xFFFFFFFF, n_arrays, descriptor_bytes),
            memoryview(message)[HEADER.size:]]


def weights_arrays(weights: Sequence[np.ndarray], version: int) -> dict[str, Any]:
    """PARAMS / PUBLISH_PARAMS arrays of a policy's weights [W0, b0, W1, b1, ...]."""
    if len(weights) >= MAX_ARRAYS:
        raise WireError(f"{len(weights)} weight arrays do not fit one message (at most {MAX_ARRAYS - 1})")
    return {"version": np.int64(version), **{f"w{i}": w for i, w in enumerate(weights)}}


def read_weights(arrays: Mapping[str, np.ndarray]) -> tuple[int, list[np.ndarray]]:
    """(version, [copies of w0, w1, ...]) from PARAMS; refuses a gap in the numbering."""
    count = sum(1 for name in arrays if name[:1] == "w" and name[1:].isdigit())
    try:
        weights = [np.array(arrays[f"w{i}"]) for i in range(count)]
    except KeyError as missing:
        raise WireError(f"weights are numbered with a gap: {missing} is missing") from None
    return int(arrays["version"]), weights





def framed(obs: np.ndarray, next_obs: np.ndarray, frames: int) -> dict[str, np.ndarray]:
    """A framed INSERT's observations: each distinct frame of obs and next_obs once, and the indices
    that stack them again (`frames` = k per observation; rlbench.kit.frames.pack)."""
    from rlbench.kit.frames import pack

    distinct, obs_refs, next_refs = pack(obs, next_obs, frames)
    return {"frames": distinct, "obs_frames": obs_refs, "next_obs_frames": next_refs}


def frames_problem(arrays: Mapping[str, np.ndarray], frames: int) -> str:
    """Why a framed INSERT's indices cannot stack its frames ("" when they can): a row without frames,
    a number per observation other than the run's `frames` (0: any), an index outside `frames`. What
    decode cannot tell from the layout alone; the replay node asks before it stores the frames."""
    per_observation = arrays["obs_frames"].shape[1]
    if per_observation < 1:
        return "obs_frames has no frame per observation"
    if frames and per_observation != frames:
        return f"obs_frames stacks {per_observation} frames per observation, but this run's observations are {frames}"
    count = len(arrays["frames"])
    for name in ("obs_frames", "next_obs_frames"):
        refs = arrays[name]
        lowest, highest = int(refs.min()), int(refs.max())
        if lowest < 0 or highest >= count:
            return (f"{name} refers to frame {lowest if lowest < 0 else highest}, but the message carries {count} "
                    f"frames (0 to {count - 1})")
    return ""


def stacked_stand_ins(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """obs and next_obs of a framed INSERT as read-only stand-ins of the stacks' dtype and shape (no
    memory, no copy): for checks of the layout before the frames are stored as they came."""
    rows, per_observation = arrays["obs_frames"].shape
    frames = arrays["frames"]
    shape = (rows, per_observation, *frames.shape[1:]) if per_observation > 1 else (rows, *frames.shape[1:])
    stand_in = np.broadcast_to(np.zeros((), dtype=frames.dtype), shape)
    return {"obs": stand_in, "next_obs": stand_in}


def stacked(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A framed INSERT's arrays with obs and next_obs stacked again from its frames (checked first
    with `frames_problem`), in place of the frame arrays; a stacked INSERT's as they are."""
    if "frames" not in arrays:
        return dict(arrays)
    from rlbench.kit.frames import unpack

    obs, next_obs = unpack(arrays["frames"], arrays["obs_frames"], arrays["next_obs_frames"])
    rest = {name: value for name, value in arrays.items() if name not in FRAMED}
    return {**rest, "obs": obs, "next_obs": next_obs}


def shifted_stacks(obs: np.ndarray, next_obs: np.ndarray) -> np.ndarray | None:
    """The (rows, k + 1, *frame) array that a batch's obs and next_obs are views of, obs its frames
    [0, k) and next_obs [1, k + 1) of each row (k = 1: frame 0 and frame 1), as a memory of frames
    samples them when every next_obs is its obs shifted by one frame (rlbench.kit.frames.FrameRing.read);
    None for any other pair. Told from the arrays' memory layout alone (nothing is compared or copied)."""
    base = obs.base if isinstance(obs, np.ndarray) else None
    if (not isinstance(base, np.ndarray) or not isinstance(next_obs, np.ndarray) or next_obs.base is not base
            or base.ndim < 3 or base.shape[1] < 2 or not base.flags.c_contiguous):
        return None
    k = base.shape[1] - 1
    views = (base[:, 0], base[:, 1]) if k == 1 else (base[:, :k], base[:, 1:])
    for array, view in zip((obs, next_obs), views):
        if (array.dtype != view.dtype or array.shape != view.shape or array.strides != view.strides
                or array.ctypes.data != view.ctypes.data):
            return None
    return base


def unshifted(arrays: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
    """A BATCH's arrays with obs and next_obs (views of `stacks` when it carries them instead)."""
    stacks = arrays.get("stacks")
    if stacks is None:
        return arrays
    k = stacks.shape[1] - 1
    obs, next_obs = (stacks[:, 0], stacks[:, 1]) if k == 1 else (stacks[:, :k], stacks[:, 1:])
    return {**{name: value for name, value in arrays.items() if name != "stacks"}, "obs": obs, "next_obs": next_obs}


def state_of(arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """A STATE reply as plain numbers (and the reason text)."""
    state: dict[str, Any] = {name: int(arrays[name]) for name in STATE_FIELDS}
    state["done_reason"] = read_text(arrays["done_reason"])
    return state


def largest_message(spec: Any, policy_shapes: Sequence[tuple[int, ...]] | None, *, insert_rows: int,
                    batch_size: int, frames: int = 0, shards: int = 1) -> tuple[str, int]:
    """(what, bytes) of the largest message a run of this environment and policy sends (`message_sizes`)."""
    sizes = message_sizes(spec, policy_shapes, insert_rows=insert_rows, batch_size=batch_size, frames=frames,
                          shards=shards)
    what = max(sizes, key=sizes.__getitem__)
    return what, sizes[what]


def message_sizes(spec: Any, policy_shapes: Sequence[tuple[int, ...]] | None, *, insert_rows: int,
                  batch_size: int, frames: int = 0, shards: int = 1) -> dict[str, int]:
    """Bytes of the largest messages a run of this environment and policy sends: an INSERT of
    `insert_rows` transitions with priorities, a BATCH of `batch_size` (stacked), and the weights
    (PARAMS; left out when `policy_shapes` is None: the algorithm does not say them). `frames`
    (transitions.frames_of(spec)) > 0: the INSERT is framed, with the most distinct frames its rows
    can hold: a row's obs brings k, its next_obs (the stack shifted by one) one more, so rows * (k + 1)
    for a stack, 2 * rows for unstacked images (k = 1). `shards` > 1 (--replay-shards): a shard's
    BATCH also carries its memory's priority mass (mass, min_mass; ReplayNode._batch), and one shard
    may serve a whole batch."""
    observation = np.zeros((1, *spec.observation_shape), dtype=spec.observation_dtype)
    action = (np.zeros(1, np.int64) if spec.action_kind == "discrete"
              else np.zeros((1, *spec.action_shape), np.float32))

    def outcomes(n: int) -> dict[str, np.ndarray]:
        return {"action": np.repeat(action, n, 0), "reward": np.zeros(n, np.float32), "done": np.zeros(n, np.float32)}

    def observations(n: int) -> dict[str, np.ndarray]:
        return {"obs": np.repeat(observation, n, 0), "next_obs": np.repeat(observation, n, 0)}

    if frames:
        frame = observation[0, 0] if frames > 1 else observation[0]
        refs = np.zeros((insert_rows, frames), np.int32)
        inserted = {"frames": np.zeros((insert_rows * (frames + 1 if frames > 1 else 2), *frame.shape), frame.dtype),
                    "obs_frames": refs, "next_obs_frames": refs}
    else:
        inserted = observations(insert_rows)
    sharded = {"mass": np.float64(0), "min_mass": np.float64(0)} if shards > 1 else {}
    candidates = {
        "INSERT": {**inserted, **outcomes(insert_rows), "produced": np.int64(0), "priorities": np.zeros(insert_rows)},
        "BATCH": {**observations(batch_size), **outcomes(batch_size), "indices": np.zeros(batch_size, np.int64),
                  "weights": np.zeros(batch_size, np.float32), "step": np.int64(0), **sharded},
    }
    if policy_shapes is not None:
        candidates["PARAMS (the policy's weights)"] = weights_arrays(
            [np.zeros(shape, np.float32) for shape in policy_shapes], 0)
    return {what: encoded_bytes(Op.PARAMS, arrays) for what, arrays in candidates.items()}


# ---------------------------------------------------------------------------------- authentication
def role_key(secret: bytes, role: str, index: int) -> bytes:
    """The key of one role of a run: what that role holds instead of the run's secret."""
    return hmac.digest(secret, b"key" + role.encode() + struct.pack("<q", index), "sha256")


def node_proof(key: bytes, client_nonce: bytes, node_nonce: bytes) -> bytes:
    """What the node sends in CHALLENGE: it knows the run's secret, from which the role's key comes
    (so a client never talks to an impostor that took over the address)."""
    return hmac.digest(key, b"node" + client_nonce + node_nonce, "sha256")


def role_proof(key: bytes, role: str, index: int, node_nonce: bytes, client_nonce: bytes) -> bytes:
    """What a role sends in AUTH: it holds the key of the role it claims, bound to both nonces (a
    recorded AUTH is worth nothing on another connection)."""
    message = b"role" + role.encode() + struct.pack("<q", index) + node_nonce + client_nonce
    return hmac.digest(key, message, "sha256")


def proofs_match(expected: bytes, got: Any) -> bool:
    return hmac.compare_digest(expected, bytes(got))


# ------------------------------------------------------------------------------- the native codec
EXTENT_FORMAT = "<I"  # one dimension of a shape (descriptors carry ndim of them)


def _native_layout(op_code: int, n_arrays: int, block: bytes, request_id: int) -> tuple[Op, list, int, list]:
    """A descriptor block checked against its op's schema (`_checked_layout`), in the form the native
    codec remembers: (op, [(name, dtype, shape, offset, nbytes)], end, [(entry, spec, native, low,
    high)]) where `native` marks a scalar range the C code can check exactly (bounds that are exact
    doubles); every other check it leaves to `_check_value`."""
    key = (op_code, n_arrays, block)
    entries, end, values = _LAYOUTS.get(key) or _checked_layout(key, request_id)
    position = {entry[0]: i for i, entry in enumerate(entries)}
    checks = []
    for name, spec in values:
        native = isinstance(spec, Scalar) and float(spec.low) == spec.low and float(spec.high) == spec.high
        checks.append((position[name], spec, native, float(spec.low) if native else 0.0,
                       float(spec.high) if native else 0.0))
    described = [(name, dtype, (count,) if shape is None else tuple(shape), offset, nbytes)
                 for name, dtype, count, shape, offset, nbytes in entries]
    return Op(op_code), described, end, checks


def _native_codec() -> tuple[Any, str]:
    """(rlbench._wire's codec built from this module's definitions, "") or (None, why not)."""
    try:
        from rlbench import _wire
    except ImportError as exc:
        return None, f"rlbench._wire is not built ({exc}); build it with `pip install -e .` (needs numpy and gcc)"
    implemented = tuple(_wire.FORMATS)
    declared = (HEADER.format, ARRAY_TAIL.format, EXTENT_FORMAT, NBYTES.format)
    if implemented != declared:
        return None, f"rlbench._wire implements the framing {implemented}, this module declares {declared}: rebuild it"
    ops = tuple(Op(code) if code in Op._value2member_map_ else None for code in range(256))
    codec = _wire.Codec(magic=MAGIC, version=VERSION, dtypes=tuple(DTYPES), ops=ops, max_arrays=MAX_ARRAYS,
                        max_message_bytes=MAX_MESSAGE_BYTES, layout_of=_native_layout, check_value=_check_value,
                        encode=python_encode, decode=python_decode)
    return codec, ""


NATIVE, NATIVE_REASON = _native_codec()
encode = NATIVE.encode if NATIVE is not None else python_encode
decode = NATIVE.decode if NATIVE is not None else python_decode
