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
    assert lz.valid(108.99)
    assert not lz.valid(109.0)
    assert lz.state == core.LOST


def test_lost_is_final_even_if_an_answer_comes_later():
    lz = lease(sent_at=100.0)
    assert not lz.valid(200.0)
    lz.extend(sent_at=199.0, ttl=9.0, at=200.0)
    assert not lz.valid(200.0) and lz.is_lost() is True


def test_an_answer_arriving_after_the_view_ran_out_does_not_revive_it():
    lz = lease(ttl=9.0, margin=0.1, sent_at=100.0)  # valid until 108.1
    lz.extend(sent_at=105.0, ttl=9.0, at=108.5)  # answered too late
    assert lz.state == core.LOST


def test_a_pending_lease_may_be_restarted_by_its_first_answer():
    lz = core.Lease(7, 9.0, 0.1, 100.0)  # the open was sent at 100
    assert not lz.valid(120.0) and lz.state == core.PENDING
    lz.extend(sent_at=119.0, ttl=9.0, at=120.0)
    lz.until  # 119 + 9 - 0.9
    assert lz.valid(127.0)
    assert lz.state == core.PENDING


def test_closed_is_not_lost():
    lz = lease()
    lz.mark_closed()
    assert not lz.valid(100.0) and not lz.is_lost()


def test_answers_are_credited_to_the_ask_they_echo_only():
    r = core.Renewals()
    lz = lease(ttl=9.0, sent_at=0.0)  # valid until 8.1
    r.add(lz, first=0.0)
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


def test_an_expired_answer_marks_the_lease_lost_and_stops_renewing():
    r = core.Renewals()
    lz = lease(sent_at=0.0)
    r.add(lz, first=0.0)
    (ask,) = r.due(0.0)
    r.answer(7, ask.ask_id, 0, True, 0.1)
    assert lz.state == core.LOST and 7 not in r.entries


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
    with pytest.raises(raftlock.Unavailable):
        at.failed("a:1", FakeStatus(grpc.StatusCode.UNAVAILABLE, "no leader"))


def test_refusals_of_every_endpoint_give_up_at_once():
    at = core.Attempts(core.Endpoints(["a:1", "b:1"]), write=True, deadline=core.now() + 100)
    refused = FakeStatus(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; Connection refused")
    for _ in range(core.REFUSED_ROUNDS - 1):
        at.failed("a:1", refused)
        at.failed("b:1", refused)
    at.failed("a:1", refused)
    with pytest.raises(raftlock.Unavailable, match="no node accepts connections"):
        at.failed("b:1", refused)
    assert not at.sent


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
