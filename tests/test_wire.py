"""The wire format: arrays round-trip exactly; anything malformed is a WireError, never a crash."""

from __future__ import annotations

import numpy as np
import pytest

from rlbench.runtime.distributed.messages import DTYPES, MAX_ARRAYS, Op, WireError, decode, encode


def joined(parts) -> bytes:
    return b"".join(bytes(memoryview(p).cast("B")) if not isinstance(p, bytes) else p for p in parts)


def test_every_dtype_and_shape_round_trips_exactly():
    rng = np.random.default_rng(0)
    arrays = {f"a{i}": (rng.standard_normal((3, 5)) * 100).astype(dtype) for i, dtype in enumerate(DTYPES)}
    arrays.update(scalar=np.float64(0.25), empty=np.zeros((0, 7), np.float32), strided=np.arange(40).reshape(8, 5)[:, ::2],
                  cube=np.arange(24, dtype=np.int16).reshape(2, 3, 4))
    op, request_id, decoded = decode(joined(encode(Op.BATCH, arrays, request_id=77)))
    assert op == Op.BATCH and request_id == 77 and list(decoded) == list(arrays)
    for name, array in arrays.items():
        assert decoded[name].dtype == np.asarray(array).dtype and decoded[name].shape == np.shape(array)
        np.testing.assert_array_equal(decoded[name], array)
    assert all(d.ctypes.data % 8 == 0 for d in decoded.values() if d.size)  # aligned views, no copies


def test_unsupported_input_is_refused_when_encoding():
    with pytest.raises(WireError, match="cannot travel"):
        encode(Op.INSERT, {"text": np.array(["a"])})
    with pytest.raises(WireError, match="too many arrays"):
        encode(Op.INSERT, {f"x{i}": np.zeros(1) for i in range(MAX_ARRAYS + 1)})


@pytest.mark.parametrize("mutate, message", [
    (lambda m: m[:5], "truncated message"),
    (lambda m: b"XX" + m[2:], "bad magic"),
    (lambda m: m[:2] + bytes([9]) + m[3:], "wire version 9"),
    (lambda m: m[:3] + bytes([250]) + m[4:], "unknown op 250"),
    (lambda m: m[:-3], "truncated message"),
    (lambda m: m + b"\0" * 8, "trailing bytes"),
])
def test_malformed_messages_raise_wire_errors(mutate, message):
    good = joined(encode(Op.INSERT, {"obs": np.ones((4, 4), np.float32), "action": np.arange(4)}, 3))
    with pytest.raises(WireError, match=message):
        decode(mutate(good))


def test_oversize_and_lying_shapes():
    good = joined(encode(Op.INSERT, {"obs": np.ones((4, 4), np.float32)}, 3))
    with pytest.raises(WireError, match="oversize"):
        decode(good, max_bytes=len(good) - 1)
    lying = bytearray(good)
    shape_at = 12 + 1 + 3 + 2  # header, name length, "obs", dtype + ndim
    lying[shape_at] = 5  # claims 5 rows of 4 floats, carries 4
    with pytest.raises(WireError, match="does not make"):
        decode(bytes(lying))


def test_random_corruption_only_ever_raises_wire_errors():
    good = bytearray(joined(encode(Op.INSERT, {"obs": np.ones((4, 4), np.float32), "x": np.arange(3)}, 1)))
    rng = np.random.default_rng(1)
    for _ in range(3000):
        message = bytearray(good)
        for position in rng.integers(0, len(message), size=rng.integers(1, 8)):
            message[position] = rng.integers(0, 256)
        try:
            decode(bytes(message))
        except WireError:
            pass


def test_a_remembered_layout_still_checks_every_message():
    good = joined(encode(Op.INSERT, {"obs": np.ones((4, 4), np.float32), "action": np.arange(4)}, 3))
    first, second = decode(good), decode(good)  # the second reuses the layout parsed for the first
    np.testing.assert_array_equal(first[2]["obs"], second[2]["obs"])
    for bad, message in ((good[:-3], "truncated message"), (good + b"\0" * 8, "trailing bytes")):
        with pytest.raises(WireError, match=message):
            decode(bad)
    claims_more = bytearray(good)
    claims_more[10:12] = (len(good)).to_bytes(2, "little")  # descriptor bytes beyond the message
    with pytest.raises(WireError, match="cannot hold"):
        decode(bytes(claims_more))
    claims_less = bytearray(good)
    claims_less[10:12] = (int.from_bytes(good[10:12], "little") - 8).to_bytes(2, "little")
    with pytest.raises(WireError):
        decode(bytes(claims_less))
