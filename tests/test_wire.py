"""The wire (runtime/distributed/messages.py): arrays round-trip exactly; anything malformed, and
anything that breaks its op's schema, is a WireError naming what is wrong — never a crash."""

from __future__ import annotations

import numpy as np
import pytest

from rlbench.runtime.distributed.messages import (DTYPES, HEADER, MAX_ARRAYS, SCHEMAS, Op, WireError,
                                                   decode, encode, joined, read_weights, weights_arrays)


def insert(n=4, **changes):
    arrays = {"obs": np.ones((n, 4), np.float32), "action": np.arange(n), "reward": np.ones(n, np.float32),
              "next_obs": np.ones((n, 4), np.float32), "done": np.zeros(n, np.float32), "produced": np.int64(n)}
    arrays.update(changes)
    return {k: v for k, v in arrays.items() if v is not None}


def round_trip(op, arrays, request_id=0):
    return decode(joined(encode(op, arrays, request_id)))


def test_every_dtype_round_trips_exactly_through_the_ops_that_carry_it():
    rng = np.random.default_rng(0)
    for dtype in DTYPES:
        values = (rng.standard_normal((3, 5)) * 100).astype(dtype)
        if dtype.kind == "f":  # observations are real
            arrays = insert(3, obs=values, next_obs=values[::-1].copy())
        elif dtype.kind in "iu":  # actions may be any integer type
            arrays = insert(3, action=values[:, 0].copy())
        else:  # bool: done flags
            arrays = insert(3, done=values[:, 0].copy())
        op, request_id, decoded = round_trip(Op.INSERT, arrays, request_id=77)
        assert op == Op.INSERT and request_id == 77 and list(decoded) == list(arrays), dtype
        for name, array in arrays.items():
            assert decoded[name].dtype == np.asarray(array).dtype and decoded[name].shape == np.shape(array)
            np.testing.assert_array_equal(decoded[name], array)
        assert all(d.ctypes.data % 8 == 0 for d in decoded.values() if d.size)  # aligned views, no copies


def test_strided_and_multidimensional_arrays_arrive_as_sent():
    obs = np.arange(3 * 2 * 4 * 2, dtype=np.float32).reshape(3, 2, 4, 2)[:, :, :, 0]  # not contiguous
    _, _, decoded = round_trip(Op.INSERT, insert(3, obs=obs, next_obs=obs.copy()))
    np.testing.assert_array_equal(decoded["obs"], obs)


def test_weights_round_trip_in_order():
    weights = [np.full((4, 3), i, np.float32) if i % 2 == 0 else np.full(3, i, np.float32) for i in range(6)]
    op, _, decoded = round_trip(Op.PARAMS, weights_arrays(weights, version=12))
    version, got = read_weights(decoded)
    assert op == Op.PARAMS and version == 12 and len(got) == 6
    for expected, array in zip(weights, got):
        np.testing.assert_array_equal(array, expected)


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
    good = joined(encode(Op.INSERT, insert(), 3))
    with pytest.raises(WireError, match=message):
        decode(mutate(good))


def test_an_old_peer_gets_a_clear_version_error_with_its_request_id():
    old = bytearray(joined(encode(Op.INSERT, insert(), 41)))
    old[2] = 2  # a version-2 peer
    with pytest.raises(WireError, match=r"wire version 2 not supported \(this side speaks 3\)") as error:
        decode(bytes(old))
    assert error.value.request_id == 41  # so the node can answer it


def test_oversize_and_lying_shapes():
    good = joined(encode(Op.INSERT, insert(), 3))
    with pytest.raises(WireError, match="oversize"):
        decode(good, max_bytes=len(good) - 1)
    lying = bytearray(good)
    shape_at = HEADER.size + 1 + 3 + 2  # header, name length, "obs", dtype + ndim
    lying[shape_at] = 5  # claims 5 rows of 4 floats, carries 4
    with pytest.raises(WireError, match="does not make"):
        decode(bytes(lying))


def test_random_corruption_only_ever_raises_wire_errors():
    good = bytearray(joined(encode(Op.INSERT, insert(), 1)))
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
    good = joined(encode(Op.INSERT, insert(), 3))
    first, second = decode(good), decode(good)  # the second reuses the layout checked for the first
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
    # and a remembered layout still checks the scalars' values of every message
    with pytest.raises(WireError, match="produced"):
        decode(joined(encode(Op.INSERT, insert(produced=np.int64(-5)), 3)))


# Every hostile-but-well-formed message found against the v2 node (issue #13) is refused at decode.
@pytest.mark.parametrize("op, arrays, message", [
    (Op.SAMPLE, {"batch_size": np.int64(32), "beta": np.float64(2.0)}, r"beta = 2.0 is outside \[0, 1\]"),
    (Op.SAMPLE, {"batch_size": np.int64(1 << 40), "beta": np.float64(0.4)}, "batch_size = 1099511627776 is outside"),
    (Op.SAMPLE, {"batch_size": np.float64(32), "beta": np.float64(0.4)}, "batch_size must be a scalar of kind"),
    (Op.SAMPLE, {"batch_size": np.int64(32), "beta": np.float64(np.nan)}, "beta = nan is outside"),
    (Op.INSERT, insert(produced=np.uint64(2**64 - 1)), "produced = 18446744073709551615 is outside"),
    (Op.HELLO, {"role": np.int64(10**18), "index": np.int64(0), "nonce": np.zeros(16, np.uint8)},
     "role must be a 1-D uint8 array"),
    (Op.HELLO, {"role": np.zeros(4096, np.uint8), "index": np.int64(0), "nonce": np.zeros(16, np.uint8)},
     "role has 4096 bytes"),
    (Op.HELLO, {"role": np.frombuffer(b"\xff\xfe", np.uint8), "index": np.int64(0), "nonce": np.zeros(16, np.uint8)},
     "not utf-8"),
    (Op.HELLO, {"role": np.frombuffer(b"actor", np.uint8), "index": np.int64(0), "nonce": np.zeros(3, np.uint8)},
     "nonce has 3 bytes"),
    (Op.BYE, {"report": np.frombuffer(b"[1, 2]", np.uint8)}, "must be a JSON object, got list"),
    (Op.BYE, {"report": np.frombuffer(b"{not json", np.uint8)}, "is not JSON"),
    (Op.INSERT, insert(reward=None), "INSERT lacks reward"),
    (Op.INSERT, insert(extra=np.zeros(4)), "INSERT carries no array named 'extra'"),
    (Op.INSERT, insert(action=np.arange(5)), "action has 5 rows, other arrays 4"),
    (Op.INSERT, insert(next_obs=np.ones((4, 5), np.float32)), "obs and next_obs must have the same shape"),
    (Op.INSERT, insert(obs=None, next_obs=None), r"INSERT lacks obs, next_obs \(or frames, obs_frames, next_obs_frames\)"),
    (Op.INSERT, insert(next_obs=None), "INSERT lacks next_obs"),
    (Op.INSERT, insert(0), "0 rows"),
    (Op.INSERT, insert(priorities=np.ones(3)), "priorities has 3 rows"),
    (Op.UPDATE_PRIORITIES, {"indices": np.arange(4), "priorities": np.ones(3), "learner_updates": np.int64(1)},
     "4 indices but 3 priorities"),
    (Op.PUBLISH_PARAMS, {"version": np.int64(1), "w0": np.int64(3)}, "weight array w0 must be a real array"),
    (Op.CREDIT, {"credit": np.int64(1 << 20), "beta": np.float64(0.5)}, "credit = 1048576 is outside"),
])
def test_hostile_but_well_formed_messages_are_refused_at_decode(op, arrays, message):
    with pytest.raises(WireError, match=message):
        round_trip(op, arrays)


def test_every_op_has_a_schema():
    assert set(SCHEMAS) == set(Op)


def test_an_array_name_twice_is_refused():
    message = joined(encode(Op.CREDIT, {"credit": np.int64(1), "xredit": np.int64(1000), "beta": np.float64(0.5)}))
    with pytest.raises(WireError, match="appears twice"):
        decode(message.replace(b"\x06xredit", b"\x06credit"))
