"""The ``register`` and ``plan`` messages: exact encoding, every rejection reason, fuzzing."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from shadefs.control import protocol as P

H = b"\x01" * 8
RID = b"\x02" * 8


def test_plan_roundtrip_is_compact_and_exact():
    ids = np.arange(1_280_000, dtype=np.uint32)[::-1]
    frames = P.encode_plan(H, 3, 7, [640_000, 640_000], ids, window=512)
    # 4 bytes per sample: a 1.28M-sample epoch (two announced) is 10 MiB, not 60 MB per epoch
    assert sum(len(f) for f in frames) == 8 + 4 + 8 + 16 + 8 + 4 * 1_280_000
    m = P.decode_request(frames)
    assert isinstance(m, P.PlanMessage)
    assert (m.handle, m.stream, m.first_epoch, m.window) == (H, 3, 7, 512)
    assert m.segments.tolist() == [640_000, 640_000]
    assert np.array_equal(m.ids, ids)
    assert not P.wants_reply(frames)


def test_register_roundtrip_and_reply():
    frames = P.encode_register_request(RID, b"", ["a/b.png", "c.png"])
    m = P.decode_request(frames)
    assert isinstance(m, P.RegisterRequest) and m.handle == b"" and m.paths == ["a/b.png", "c.png"]
    assert P.wants_reply(frames)
    r = P.decode_reply(P.encode_register_reply(RID, H, 2))
    assert isinstance(r, P.RegisterReply) and (r.request_id, r.handle, r.size) == (RID, H, 2)


def test_withdraw_roundtrip_is_one_way():
    frames = P.encode_withdraw(H, 2**32 - 1)
    assert frames == [b"SHADEFS1", b"withdraw", H, b"\xff\xff\xff\xff"]
    m = P.decode_request(frames)
    assert isinstance(m, P.PlanWithdraw) and (m.handle, m.stream) == (H, 2**32 - 1)
    assert not P.wants_reply(frames) and not P.wants_reply([b"SHADEFS1", b"withdraw", b"bad"])
    for bad in ([P.VERSION, P.WITHDRAW, b"short", b"\0" * 4], [P.VERSION, P.WITHDRAW, H, b"\0" * 8],
                [P.VERSION, P.WITHDRAW, H]):
        with pytest.raises(P.ProtocolError) as e:
            P.decode_request(bad)
        assert e.value.reason == "malformed"
    for handle, stream in ((b"x", 0), (H, -1), (H, 2**32)):
        with pytest.raises(P.ProtocolError) as e:
            P.encode_withdraw(handle, stream)
        assert e.value.reason == "malformed"


def _plan_frames(**over):
    f = P.encode_plan(H, 0, 0, [3], np.array([0, 1, 2], dtype=np.uint32))
    for i, v in over.items():
        f[int(i[1:])] = v
    return f


@pytest.mark.parametrize("frames,reason", [
    (_plan_frames(f2=b"short"), "malformed"),                                   # handle not 8 bytes
    (_plan_frames(f3=b"\x00" * 15), "malformed"),                               # meta not 16 bytes
    (_plan_frames(f3=np.array([3, 0, 0, 0], "<u4").tobytes()), "version"),      # unknown plan format
    (_plan_frames(f3=np.array([2, 0, 0, 0], "<u4").tobytes()), "malformed"),    # format 2 is 32 bytes
    (_plan_frames(f3=np.array([1, 0, 0, 0, 5, 0, 7, 0], "<u4").tobytes()), "malformed"),  # format 1 is 16
    (_plan_frames(f4=b""), "malformed"),                                        # no segment
    (_plan_frames(f4=b"\x00" * 5), "malformed"),                                # segments not 4-byte
    (_plan_frames(f4=np.ones(P.MAX_PLAN_SEGMENTS + 1, "<u4").tobytes()), "oversize"),
    (_plan_frames(f5=b"\x00" * 13), "length_mismatch"),                         # ids not 4-byte
    (_plan_frames(f4=np.array([4], "<u4").tobytes()), "length_mismatch"),       # segments != ids
    (_plan_frames(f5=b"\x00" * 4 * (P.MAX_PLAN_IDS + 1)), "oversize"),
    (_plan_frames()[:5], "malformed"),                                          # frame count
    (P.encode_register_request(RID, b"", ["a"])[:2] + [RID, b"abc", b"a"], "malformed"),
    (P.encode_register_request(RID, b"", ["a"])[:4] + [b"/abs"], "bad_path"),
])
def test_each_defect_names_its_reason(frames, reason):
    with pytest.raises(P.ProtocolError) as e:
        P.decode_request(frames, max_bytes=2**31)
    assert e.value.reason == reason


def test_encoder_refuses_what_the_daemon_would():
    with pytest.raises(P.ProtocolError) as e:
        P.encode_plan(H, 0, 0, [2], np.array([1, 2, 3]))
    assert e.value.reason == "length_mismatch"
    with pytest.raises(P.ProtocolError) as e:
        P.encode_plan(H, 0, 0, [1], np.array([-1]))
    assert e.value.reason == "malformed"
    with pytest.raises(P.ProtocolError) as e:
        P.encode_plan(b"x", 0, 0, [0], np.array([], dtype=np.uint32))
    assert e.value.reason == "malformed"
    with pytest.raises(P.ProtocolError) as e:
        P.encode_register_request(RID, b"", ["../up"])
    assert e.value.reason == "bad_path"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=40), min_size=0, max_size=8),
       st.sampled_from([P.PLAN, P.REGISTER, P.WITHDRAW, b"x"]))
def test_fuzzed_frames_only_ever_raise_protocol_error(rest, kind):
    frames = [P.VERSION, kind] + rest
    try:
        m = P.decode_request(frames)
    except P.ProtocolError as e:
        assert e.reason in P.REASONS
    else:
        assert isinstance(m, (P.PlanMessage, P.RegisterRequest, P.PlanWithdraw))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2**32 - 1), max_size=20), min_size=1, max_size=4),
       st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
def test_valid_plans_roundtrip(segs, stream, epoch, window):
    ids = np.array([i for s in segs for i in s], dtype=np.uint32)
    m = P.decode_request(P.encode_plan(H, stream, epoch, [len(s) for s in segs], ids, window=window))
    assert (m.stream, m.first_epoch, m.window) == (stream, epoch, window)
    assert m.segments.tolist() == [len(s) for s in segs] and m.ids.tolist() == ids.tolist()


def test_plan_format_2_carries_the_job_and_format_1_still_decodes():
    f = P.encode_plan(H, 3, 4, [3], np.array([0, 1, 2], dtype=np.uint32), window=9, job=(4242, 2**40 + 5))
    assert len(f[3]) == P.PLAN_META_JOB_BYTES
    m = P.decode_request(f)
    assert (m.stream, m.first_epoch, m.window, m.job) == (3, 4, 9, (4242, 2**40 + 5))
    assert P.decode_request(P.encode_plan(H, 3, 4, [3], np.array([0, 1, 2], dtype=np.uint32))).job is None
    with pytest.raises(P.ProtocolError) as e:
        P.encode_plan(H, 0, 0, [1], np.array([0], dtype=np.uint32), job=(2**32, 0))
    assert e.value.reason == "malformed"


def test_register_reply_says_which_plan_format_the_daemon_reads():
    new = P.decode_reply(P.encode_register_reply(RID, H, 7))
    assert (new.handle, new.size, new.plan_format) == (H, 7, P.PLAN_FORMAT_JOB)
    old = P.encode_stats_reply(RID, {"handle": H.hex(), "size": 7})  # a daemon before format 2
    old[1] = P.REGISTER
    assert P.decode_reply(old).plan_format == P.PLAN_FORMAT
