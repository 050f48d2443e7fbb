"""The messages between the server and a python worker (``backends/python/messages.py``):
every message comes back as it was sent, and the two of every request (``Execute``,
``ExecuteReply``), whose repeating part each side keeps, come back with their own id and
durations however often that part repeats."""

from __future__ import annotations

import multiprocessing
import threading

import pytest

from sluice.backends.python import messages as m

REFS = (("INPUT0", "FP32", (1, 4), 0, 16), ("INPUT1", "FP32", (1, 4), 64, 16))
REQUEST = ("", REFS, ("OUTPUT0", "OUTPUT1"), "{}")


def test_execute_and_its_reply_keep_their_ids_and_durations_when_the_rest_repeats() -> None:
    for i in range(1, 6):
        sent = m.Execute(i, "sl_1_i0", (REQUEST,), lane=i % 2, behind=i % 2)
        got = m.decode(m.encode(sent))
        assert got == sent and type(got) is m.Execute
        reply = m.ExecuteReply(i, "sl_1_o0", ((m.OK, REFS),), 10 * i, 20 * i, 30 * i, ("{}",))
        back = m.decode(m.encode(reply))
        assert back == reply and type(back) is m.ExecuteReply


def test_an_execute_that_differs_in_its_rest_is_not_taken_for_another() -> None:
    a = m.Execute(7, "sl_1_i0", (REQUEST,))
    b = m.Execute(7, "sl_1_i1", (("r1", REFS, ("OUTPUT0",), '{"k": 1}'),))
    assert m.decode(m.encode(a)) == a
    assert m.decode(m.encode(b)) == b
    error = m.ExecuteReply(8, "", ((13, "the model failed"),), 1, 2, 3)
    assert m.decode(m.encode(error)) == error


def test_the_other_messages_travel_whole() -> None:
    for msg in (
        m.Stop(3),
        m.Cancel(4, 0),
        m.Ready(0, 1234, True),
        m.Stopped(3),
        m.InitFailed(0, "no model.py"),
    ):
        assert m.decode(m.encode(msg)) == msg


def test_the_kept_rests_are_bounded() -> None:
    for i in range(3 * m._CACHED):
        sent = m.Execute(i, f"sl_{i}_i0", (REQUEST,))
        assert m.decode(m.encode(sent)) == sent
    assert len(m._pickled) <= m._CACHED and len(m._unpickled) <= m._CACHED


def test_frames_read_and_written_as_a_multiprocessing_connection_does() -> None:
    """``send_frame`` / ``recv_frame`` over a real pipe, interchangeable with the
    Connection's own ``send_bytes`` / ``recv_bytes``: small and large frames, an empty one,
    and the writer's close as EOFError."""
    rx, tx = multiprocessing.Pipe(duplex=False)
    small = b"x" * 100
    large = bytes(range(256)) * 400  # 102400 bytes: more than one pipe buffer
    got: list[bytes] = []

    def write() -> None:
        m.send_frame(tx, small)
        m.send_frame(tx, b"")
        m.send_frame(tx, large)
        tx.send_bytes(small)
        m.send_frame(tx, large)

    writer = threading.Thread(target=write)
    writer.start()
    got += [m.recv_frame(rx), m.recv_frame(rx), m.recv_frame(rx), m.recv_frame(rx)]
    got.append(rx.recv_bytes())
    writer.join(10)
    assert got == [small, b"", large, small, large]
    tx.close()
    with pytest.raises(EOFError):
        m.recv_frame(rx)
    rx.close()
    with pytest.raises(OSError):
        m.send_frame(rx, small)  # a closed connection
