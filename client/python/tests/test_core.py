"""The rules both clients share (``raftlock._core``), on their own: the
lease view, the keep-alive schedule and the retry policy. No cluster."""

import grpc
import pytest

import raftlock
from raftlock import _core as core


def lease(ttl=9.0, margin=0.1, sent_at=100.0, active=True):
    lz = core.Lease(7, ttl, margin, sent_at)
    if active:
        lz.state = core.VALID
    return lz


def test_the_view_runs_from_the_send_time_less_the_margin():
    lz = lease(ttl=10.0, margin=0.1, sent_at=100.0)
    assert lz.valid(108.99) and not lz.is_lost(108.99)
    assert not lz.valid(109.0) and lz.is_lost(109.0)


def test_a_view_past_its_grace_is_jeopardy_and_comes_back_with_an_answer():
    """A session that ends with its stream: past the grace count (1.8 s
    here) but before the ttl count (27 s) it is not valid, not lost, nobody
    is told, and it is still renewed; an answered keep-alive makes it valid
    again."""
    r = core.Renewals()
    lz = core.Lease(7, 30.0, 0.1, 0.0, grace=2.0)
    lz.state = core.VALID
    lz.on_lost = lambda: None
    r.add(lz, first=0.0)
    r.stream_opened(0.0)
    (ask,) = r.due(0.0)
    r.answer(7, ask.ask_id, 30000, False, 0.01)
    assert not lz.valid(5.0) and not lz.is_lost(5.0)
    r.prune(5.0)
    assert r.take_lost(5.0) == [] and 7 in r.entries
    (again,) = r.due(5.0)
    r.answer(7, again.ask_id, 30000, False, 5.01)
    assert lz.valid(5.5) and not lz.is_lost(5.5)


def test_a_view_past_its_ttl_count_is_lost_for_good():
    lz = lease(ttl=9.0, margin=0.1, sent_at=100.0)  # the ttl count ends at 108.1
    assert not lz.is_lost(108.0)
    assert lz.is_lost(108.1)
    lz.extend(sent_at=108.0, ttl=9.0)  # an answer that came too late
    assert lz.is_lost(108.2) and not lz.valid(108.2)


def test_an_answer_after_the_ttl_count_does_not_bring_the_lease_back():
    """The ttl count decides when to give up: an answer that comes after it
    ran out is not credited, even if the loss was not marked yet (as in the
    Rust client, whose keep-alive gives the lease up at that deadline)."""
    r = core.Renewals()
    lz = lease(ttl=9.0, sent_at=0.0)  # the ttl count ends at 8.1
    r.add(lz, first=0.0)
    r.stream_opened(0.0)
    (ask,) = r.due(7.0)  # sent before the count ran out, answered after
    r.answer(7, ask.ask_id, 9000, False, 8.2)
    assert lz.is_lost(8.3) and not lz.valid(8.3), "an answer after the ttl count ran out was credited"


def test_an_answer_later_than_its_asks_wait_is_not_credited():
    """An ask waits ``ask_wait`` for its answer (3 s at a 9 s ttl), as the
    Rust client's asks do: an answer that comes later, even before the
    driver dropped the ask, is not credited: it neither makes the lease
    valid again nor pushes back the ttl count."""
    r = core.Renewals()
    lz = lease(ttl=9.0, sent_at=0.0)
    r.add(lz, first=0.0)
    r.stream_opened(0.0)
    (first,) = r.due(0.0)
    r.answer(7, first.ask_id, 9000, False, 3.0)  # in time: valid until 8.1, lost at 11.1
    (late,) = r.due(5.0)
    r.answer(7, late.ask_id, 9000, False, 8.5)  # 3.5 s after its send
    assert not lz.valid(8.6), "a late answer made the lease valid again"
    assert lz.is_lost(11.1), "a late answer pushed back the ttl count"


def test_an_answer_more_than_a_ttl_after_its_send_is_not_credited():
    """A session that ends with its stream (ttl 30 s, grace 2 s): an answer
    that comes more than a ttl after its ask was sent (a process paused
    past its ttl, say) does not push back the give-up deadline."""
    r = core.Renewals()
    lz = core.Lease(7, 30.0, 0.1, 0.0, grace=2.0)
    lz.state = core.VALID
    lz.on_lost = lambda: None
    r.add(lz, first=0.0)
    r.stream_opened(0.0)
    (first,) = r.due(0.0)
    r.answer(7, first.ask_id, 30000, False, 0.01)  # the ttl count ends at 27.01
    (late,) = r.due(5.0)
    r.answer(7, late.ask_id, 30000, False, 36.0)
    assert not lz.valid(36.1) and lz.is_lost(36.1), "an answer 31 s after its send was credited"


def test_an_answer_after_the_loss_was_marked_does_not_bring_the_lease_back():
    r = core.Renewals()
    lz = lease(ttl=9.0, sent_at=0.0)  # the ttl count ends at 8.1
    r.add(lz, first=0.0)
    r.stream_opened(0.0)
    (ask,) = r.due(7.0)
    r.prune(8.15)  # marked lost
    r.answer(7, ask.ask_id, 9000, False, 8.2)
    assert lz.is_lost(8.3) and not lz.valid(8.3)


def test_the_ttl_count_runs_from_when_the_answer_came():
    """Only belief counts from the send; the loss (when to give up) counts
    from when the last answer came: an answer that took long still leaves
    a whole ttl count."""
    r = core.Renewals()
    lz = lease(ttl=9.0, sent_at=0.0)
    r.add(lz, first=0.0)
    r.stream_opened(0.0)
    (ask,) = r.due(3.0)
    r.answer(7, ask.ask_id, 9000, False, 6.0)  # answered 3 s after its send
    assert not lz.valid(3.0 + 8.1)  # believed until the send + 8.1
    assert not lz.is_lost(6.0 + 8.09) and lz.is_lost(6.0 + 8.1)  # lost at the answer + 8.1


def test_a_session_no_stream_bound_is_believed_only_a_grace_past_its_open():
    """A session that ends with its stream is believed only a grace (less
    the margin) past the send of its open, even before a stream renewed
    it: the open's own call may have been its stream."""
    lz = core.Lease(7, 30.0, 0.1, 0.0, grace=2.0)
    lz.state = core.VALID
    assert lz.valid(1.79) and not lz.valid(1.8)
    assert not lz.is_lost(1.8)  # jeopardy


def test_past_the_ttl_count_the_holders_are_told_once_and_renewals_stop():
    r = core.Renewals()
    lz = lease(ttl=9.0, sent_at=0.0)  # the ttl count ends at 8.1
    lz.on_lost = lambda: None
    r.add(lz, first=3.0)
    assert r.next_wakeup(0.0) == pytest.approx(3.0)
    r.prune(8.1)
    assert r.take_lost(8.1) == [lz] and r.take_lost(8.2) == []
    assert 7 not in r.entries and r.due(8.2) == []


def test_an_expired_session_is_lost_for_good():
    r = core.Renewals()
    lz = lease(sent_at=0.0)
    r.add(lz, first=0.0)
    (ask,) = r.due(0.0)
    r.answer(7, ask.ask_id, 0, True, 0.1)
    assert lz.state == core.LOST and 7 not in r.entries
    lz.extend(sent_at=1.0, ttl=9.0)
    assert lz.is_lost(1.1)


def test_a_pending_lease_is_handed_out_only_while_valid():
    lz = core.Lease(7, 9.0, 0.1, 100.0)  # the open was sent at 100
    assert not lz.valid(120.0) and not lz.is_lost(120.0)  # pending: not handed out
    lz.extend(sent_at=119.0, ttl=9.0)
    assert lz.valid(127.0)
    assert lz.state == core.PENDING


def test_a_session_bound_to_its_stream_is_believed_only_a_grace_past_the_last_proof():
    """The leader ends such a session a grace after its stream closes, and
    the stream may close (a dead connection) right after the last ask it
    answered was sent: the view follows, whatever the ttl."""
    r = core.Renewals()
    lz = core.Lease(7, 30.0, 0.1, 0.0, grace=2.0)
    lz.state = core.VALID
    r.add(lz, first=0.0)
    stream = r.stream_opened(0.0)
    (ask,) = r.due(0.0)
    assert ask.stream == stream
    r.answer(7, ask.ask_id, 30000, False, 0.01)
    assert lz.valid(1.79) and not lz.valid(1.8)  # 0 + 2 s less 10 %
    # The stream is pinged every grace/3, not every ttl/3.
    assert r.next_wakeup(0.1) == pytest.approx(2.0 / 3)
    (ping,) = r.due(2.0 / 3)
    r.answer(7, ping.ask_id, 30000, False, 0.7)
    assert lz.valid(2.4) and not lz.valid(2.0 / 3 + 1.8)


def test_a_stream_the_leader_ends_for_not_leading_keeps_the_grace_count():
    """The client cannot tell for sure that no grace started: the view
    still ends a grace past the last proof (jeopardy, not lost)."""
    r = core.Renewals()
    lz = core.Lease(7, 30.0, 0.1, 0.0, grace=2.0)
    lz.state = core.VALID
    r.add(lz, first=0.0)
    r.stream_opened(0.0)
    (ask,) = r.due(0.0)
    r.answer(7, ask.ask_id, 30000, False, 0.01)
    r.stream_failed(0.5)  # as when the node ended it for not leading
    assert not lz.valid(1.8) and not lz.valid(10.0)
    assert not lz.is_lost(10.0)


def test_a_broken_stream_keeps_the_grace_and_the_next_stream_rebinds_at_once():
    r = core.Renewals()
    lz = core.Lease(7, 30.0, 0.1, 0.0, grace=2.0)
    lz.state = core.VALID
    r.add(lz, first=0.0)
    r.stream_opened(0.0)
    (ask,) = r.due(0.0)
    r.answer(7, ask.ask_id, 30000, False, 0.01)
    r.stream_failed(0.5)  # a transport error: the leader may start the grace
    assert not lz.valid(1.8)
    r.stream_opened(0.6)
    (again,) = r.due(0.6)  # renewed at once on the new stream
    r.answer(7, again.ask_id, 30000, False, 0.61)
    assert lz.valid(2.3)


def test_closed_is_not_lost():
    lz = lease()
    lz.mark_closed()
    assert not lz.valid(100.0) and not lz.is_lost()


def test_answers_are_credited_to_the_ask_they_echo_only():
    r = core.Renewals()
    lz = lease(ttl=9.0, sent_at=0.0)  # valid until 8.1
    r.add(lz, first=0.0)
    r.stream_opened(0.0)
    (first,) = r.due(0.0)
    # The first ask gets no answer in time; the session asks again.
    assert not r.overdue(first.deadline - 0.001)
    r.overdue(first.deadline)
    (second,) = r.due(first.deadline + core.RENEW_RETRY)
    assert second.ask_id != first.ask_id
    # The late answer to the first ask arrives: it must not be credited to
    # the second (whose send time is later).
    assert r.answer(7, first.ask_id, 9000, False, second.sent_at + 0.1) is None
    assert lz.until == pytest.approx(8.1)
    assert r.answer(7, second.ask_id, 9000, False, second.sent_at + 0.2) is lz
    assert lz.until == pytest.approx(second.sent_at + 8.1)


def test_renewal_is_due_a_third_of_the_ttl_after_the_send():
    r = core.Renewals()
    lz = lease(ttl=9.0, sent_at=0.0)
    r.add(lz, first=3.0)
    assert r.due(2.99) == []
    (ask,) = r.due(3.0)
    r.answer(7, ask.ask_id, 9000, False, 3.5)
    assert r.due(5.99) == []
    assert len(r.due(6.0)) == 1


def test_a_stalled_stream_is_noticed():
    r = core.Renewals()
    r.add(lease(sent_at=0.0), first=0.0)
    (ask,) = r.due(0.0)
    assert r.overdue(ask.deadline) is True  # nothing came back since it was sent


def test_a_failed_stream_reschedules_its_asks_soon():
    r = core.Renewals()
    r.add(lease(sent_at=0.0), first=0.0)
    r.due(0.0)
    r.stream_failed(1.0)
    assert r.inflight == {}
    assert r.due(1.0 + core.RENEW_RETRY)


class FakeStatus(grpc.RpcError):
    """A gRPC error as the cluster or the transport would produce it."""

    def __init__(self, code, details="", md=()):
        self._code, self._details, self._md = code, details, md

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return self._md

    def initial_metadata(self):
        return ()


def not_leader(hint=None):
    md = [(core.NOT_LEADER_KEY, "1")] + ([(core.LEADER_KEY, hint)] if hint else [])
    return FakeStatus(grpc.StatusCode.UNAVAILABLE, "not the leader", md)


def test_a_leader_hint_is_followed_at_once():
    e = core.Endpoints(["a:1", "b:1"])
    at = core.Attempts(e, write=True, deadline=core.now() + 10)
    assert at.failed("a:1", not_leader("c:1")) == 0.0
    assert e.target() == "c:1"
    assert not at.sent  # a refusal: never applied


def test_no_hint_backs_off_and_a_dropped_write_becomes_unknown():
    e = core.Endpoints(["a:1"])
    at = core.Attempts(e, write=True, deadline=core.now() + 10)
    assert 0 < at.failed("a:1", not_leader()) <= core.INITIAL_BACKOFF * 1.5
    at.failed("a:1", FakeStatus(grpc.StatusCode.UNAVAILABLE, "Socket closed"))
    assert at.sent
    at.deadline = core.now()
    with pytest.raises(raftlock.OutcomeUnknown):
        at.budget(1.0)


def test_a_read_that_times_out_is_unavailable_not_unknown():
    at = core.Attempts(core.Endpoints(["a:1"]), write=False, deadline=core.now() + 10)
    at.failed("a:1", FakeStatus(grpc.StatusCode.DEADLINE_EXCEEDED))
    at.deadline = core.now()
    with pytest.raises(raftlock.Unavailable):
        at.budget(1.0)


def test_the_backoff_never_sleeps_past_the_deadline():
    at = core.Attempts(core.Endpoints(["a:1"]), write=False, deadline=core.now() + 0.001)
    with pytest.raises(raftlock.Unavailable) as raised:
        at.failed("a:1", FakeStatus(grpc.StatusCode.UNAVAILABLE, "no leader"))
    # Nodes answered: not the "no node could be asked" error.
    assert not isinstance(raised.value, raftlock.Unreachable)


def test_refusals_of_every_endpoint_give_up_at_once():
    at = core.Attempts(core.Endpoints(["a:1", "b:1"]), write=True, deadline=core.now() + 100)
    refused = FakeStatus(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; Connection refused")
    for _ in range(core.REFUSED_ROUNDS - 1):
        at.failed("a:1", refused)
        at.failed("b:1", refused)
    at.failed("a:1", refused)
    with pytest.raises(raftlock.Unreachable, match="no node accepts connections"):
        at.failed("b:1", refused)
    assert not at.sent


def test_an_unresolvable_endpoint_gives_up_at_once_and_nothing_was_sent():
    # grpcio's words for a name that does not resolve (seed-user walk,
    # 2026-11-29: OutcomeUnknown after 14.8 s, although nothing left).
    at = core.Attempts(core.Endpoints(["no-such-host.invalid:1"]), write=True, deadline=core.now() + 100)
    unresolved = FakeStatus(
        grpc.StatusCode.UNAVAILABLE,
        "errors resolving no-such-host.invalid:1: [field:hostname lookup error:address lookup failed "
        "for no-such-host.invalid:1: Domain name not found]",
    )
    for _ in range(core.REFUSED_ROUNDS - 1):
        at.failed("no-such-host.invalid:1", unresolved)
    with pytest.raises(raftlock.Unreachable, match="no node accepts connections"):
        at.failed("no-such-host.invalid:1", unresolved)
    assert not at.sent


def test_names_follow_the_512_byte_rule_before_anything_is_sent():
    assert core.check_name("n" * core.NAME_MAX_BYTES) == "n" * core.NAME_MAX_BYTES
    assert core.check_name("é" * 256) == "é" * 256
    for bad, size in (("", 0), ("n" * (core.NAME_MAX_BYTES + 1), 513), ("é" * 257, 514), ("n" * 100_000, 100_000)):
        with pytest.raises(raftlock.InvalidArgument, match=f"a lock name of {size} bytes: must be 1..=512 bytes of UTF-8"):
            core.check_name(bad)


@pytest.mark.parametrize("code,cls", [
    (grpc.StatusCode.INVALID_ARGUMENT, raftlock.InvalidArgument),
    (grpc.StatusCode.OUT_OF_RANGE, raftlock.InvalidArgument),
    (grpc.StatusCode.FAILED_PRECONDITION, raftlock.FailedPrecondition),
    (grpc.StatusCode.ABORTED, raftlock.Deadlock),
    (grpc.StatusCode.NOT_FOUND, raftlock.SessionNotFound),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, raftlock.ResourceExhausted),
    (grpc.StatusCode.UNAUTHENTICATED, raftlock.Unauthenticated),
    (grpc.StatusCode.PERMISSION_DENIED, raftlock.PermissionDenied),
    (grpc.StatusCode.INTERNAL, raftlock.RaftlockError),
])
def test_refusals_map_to_errors_and_are_not_retried(code, cls):
    at = core.Attempts(core.Endpoints(["a:1"]), write=True, deadline=core.now() + 10)
    with pytest.raises(cls) as e:
        at.failed("a:1", FakeStatus(code, "why"))
    assert e.value.code == code.name and "why" in str(e.value)
