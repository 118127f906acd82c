"""The sync client against the real cluster: locks, sessions, semaphores,
fences, election, bad input, unreachable nodes, leader hints."""

import socket
import threading
import time

import pytest

import raftlock
from raftlock import _core, _sync

from conftest import wait_for


def test_with_lock_holds_and_releases(client, name):
    with client.lock(name, ttl=5, timeout=5) as lock:
        assert isinstance(lock.fence, int) and lock.fence > 0
        assert lock.held and not lock.lost
        info = client.describe(name)
        assert [(h.fence, h.mode) for h in info.holders] == [(lock.fence, "exclusive")]
        assert client.check_fence(name, lock.fence)
    assert not lock.held
    assert client.describe(name) is None
    assert not client.check_fence(name, lock.fence)


def test_successive_holders_see_larger_fences(client, name):
    fences = []
    for _ in range(3):
        with client.lock(name) as lock:
            fences.append(lock.fence)
    assert fences == sorted(fences) and len(set(fences)) == 3


def test_release_is_idempotent(client, name):
    lock = client.lock(name)
    assert lock.acquire()
    assert lock.release() is True
    assert lock.release() is False
    assert client.describe(name) is None
    with pytest.raises(raftlock.RaftlockError, match="acquired before"):
        lock.acquire()


def test_try_once_on_a_busy_lock_raises_not_acquired_and_leaves_nothing(client, name):
    with client.lock(name):
        with pytest.raises(raftlock.NotAcquired) as e:
            with client.lock(name, timeout=0):
                pytest.fail("granted while held")
        assert e.value.timeout == 0
        assert client.lock(name, timeout=0).acquire() is False
        info = client.describe(name)
        assert len(info.holders) == 1 and not info.waiters


def test_a_bounded_wait_gives_up_and_withdraws(client, name):
    with client.lock(name):
        started = time.monotonic()
        with pytest.raises(raftlock.NotAcquired):
            with client.lock(name, timeout=0.3):
                pass
        assert time.monotonic() - started >= 0.3
        assert not client.describe(name).waiters


def test_waiters_are_granted_in_fifo_order(client, name):
    order = []
    first = client.lock(name)
    assert first.acquire()
    threads = []
    for i in range(3):
        def wait(i=i):
            with client.lock(name, timeout=30) as lock:
                order.append((i, lock.fence))
        t = threading.Thread(target=wait)
        t.start()
        threads.append(t)
        wait_for(lambda: len(client.describe(name).waiters) == i + 1, f"waiter {i} to queue")
    first.release()
    for t in threads:
        t.join(30)
    assert [i for i, _ in order] == [0, 1, 2]
    assert [f for _, f in order] == sorted(f for _, f in order)


def test_shared_holders_together_and_a_writer_waits(client, name):
    a = client.lock(name, shared=True)
    b = client.lock(name, shared=True)
    assert a.acquire() and b.acquire()
    assert client.lock(name, timeout=0).acquire() is False
    assert [h.mode for h in client.describe(name).holders] == ["shared", "shared"]
    a.release()
    b.release()
    with client.lock(name, timeout=0):
        pass


def test_a_session_holds_many_names_and_close_releases_them(client, name):
    session = client.session(ttl=5)
    a = session.acquire(name + "/a")
    b = session.acquire(name + "/b", shared=True)
    assert a.session is session and b.session is session
    assert client.describe(name + "/a").holders[0].session_id == session.id
    with pytest.raises(raftlock.FailedPrecondition):
        session.acquire(name + "/a", timeout=0)
    assert session.close() == 2
    assert session.close() == 0
    assert client.describe(name + "/a") is None and client.describe(name + "/b") is None
    assert a.release() is False  # the close released it


def test_semaphore_permits_by_weight(client, name):
    with client.session() as s1, client.session() as s2, client.session() as s3:
        big = s1.acquire(name, capacity=3, weight=2)
        assert s2.acquire(name, capacity=3, weight=1, timeout=0)
        with pytest.raises(raftlock.NotAcquired):
            s3.acquire(name, capacity=3, weight=1, timeout=0)
        with pytest.raises(raftlock.FailedPrecondition):
            s3.acquire(name, capacity=5, weight=1, timeout=0)
        big.release()
        third = s3.acquire(name, capacity=3, weight=2, timeout=5)
        assert third.fence > big.fence
        info = client.describe(name)
        assert info.semaphore and info.capacity == 3 and sum(h.weight for h in info.holders) == 3


def test_client_lock_takes_semaphore_permits_too(client, name):
    with client.lock(name, capacity=2) as a, client.lock(name, capacity=2) as b:
        assert a.fence != b.fence
        assert client.lock(name, capacity=2, timeout=0).acquire() is False


def test_deadlock_is_refused(client, name):
    s1, s2 = client.session(), client.session()
    got = []
    try:
        s1.acquire(name + "/x")
        s2.acquire(name + "/y")
        t = threading.Thread(target=lambda: got.append(s1.acquire(name + "/y", timeout=10)))
        t.start()
        wait_for(lambda: client.describe(name + "/y").waiters, "s1 to wait for y")
        with pytest.raises(raftlock.Deadlock, match="deadlock"):
            s2.acquire(name + "/x", timeout=10)
        # Refused, not queued: s2 still holds y only.
        assert not client.describe(name + "/x").waiters
    finally:
        s2.close()
        t.join(10)
        s1.close()
    assert got and got[0].fence  # s2's close handed y to s1


def test_leader_election_by_holder_value(client, name):
    assert client.leader(name) is None
    with client.lock(name, value=b"node-a:8080") as lead:
        assert client.leader(name) == (b"node-a:8080", lead.fence)
        follower = client.lock(name, value="node-b:8080")
        t = threading.Thread(target=follower.acquire)
        t.start()
        wait_for(lambda: client.describe(name).waiters, "the follower to queue")
    t.join(10)
    assert client.leader(name) == (b"node-b:8080", follower.fence)
    follower.release()


def test_the_lease_is_kept_alive_past_its_ttl(client, name):
    # ttl 1 s (the smallest): held for 2.5 ttls through keep-alives.
    with client.lock(name, ttl=1.0) as lock:
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            assert not lock.lost
            time.sleep(0.1)
        assert client.check_fence(name, lock.fence)


def test_a_session_that_ends_with_the_process_is_bound_at_once(client, name):
    """A session with end_on_disconnect is renewed on the stream before it
    is handed out; the client closing its stream ends it within the grace
    (the way a killed process's does)."""
    other = raftlock.Client(client.endpoints)
    session = other.session(ttl=30, end_on_disconnect=0.3)
    session.acquire(name)
    closed = time.monotonic()
    other.close()  # the stream closes without CloseSession
    wait_for(lambda: client.describe(name) is None, "the session to end with its stream", timeout=10)
    assert time.monotonic() - closed < 10


def test_a_stream_cut_and_reopened_within_the_grace_keeps_the_session(client, name):
    """The keep-alive stream breaks (as a dropped connection would): the
    client opens another at once and renews every session on it before
    the grace the old one started runs out."""
    session = client.session(ttl=30, end_on_disconnect=1.0)
    lock = session.acquire(name)
    ka = client._ka
    with ka.cond:
        first = ka.stream
        ka._drop(first)
        ka.cond.notify_all()
    wait_for(lambda: ka.stream is not None and ka.stream is not first, "a new stream")
    # Watched for three graces: the session, and its grant, stay.
    end = time.monotonic() + 3.0
    while time.monotonic() < end:
        info = client.describe(name)
        assert info is not None and info.holders[0].fence == lock.fence
        assert not lock.lost
        time.sleep(0.1)
    session.close()


def test_without_end_on_disconnect_the_ttl_rules(client, name):
    other = raftlock.Client(client.endpoints)
    lock = other.lock(name, ttl=3, end_on_disconnect=None)
    assert lock.acquire()
    other.close()
    time.sleep(1.0)  # well past any grace, well within the ttl
    assert client.describe(name).holders[0].fence == lock.fence
    wait_for(lambda: client.describe(name) is None, "the ttl to end it", timeout=10)


# ------------------------------------------------------------- bad input

def test_ttl_limits_at_their_edges(client, name):
    with client.lock(name, ttl=raftlock.TTL_MIN, timeout=0):
        pass
    with client.lock(name, ttl=raftlock.TTL_MAX, timeout=0):
        pass
    for bad in (0.999, 3600.001, 0, -1, float("nan"), "10", None):
        with pytest.raises(raftlock.InvalidArgument):
            client.lock(name, ttl=bad)
        with pytest.raises(raftlock.InvalidArgument):
            client.session(ttl=bad)


def test_name_limits_at_their_edges(client):
    edge = "n" * raftlock.NAME_MAX_BYTES
    with client.lock(edge, timeout=0) as lock:
        assert lock.fence
    for bad in ("n" * (raftlock.NAME_MAX_BYTES + 1), "é" * 257, ""):
        with pytest.raises(raftlock.InvalidArgument, match="must be 1..=512 bytes"):
            client.lock(bad, timeout=0).acquire()
        assert client.describe(edge) is None
    with pytest.raises(raftlock.InvalidArgument):
        client.lock(b"bytes-name")


def test_value_limit_at_its_edge(client, name):
    with client.lock(name, value=b"v" * raftlock.VALUE_MAX_BYTES, timeout=0):
        assert client.leader(name)[0] == b"v" * raftlock.VALUE_MAX_BYTES
    with pytest.raises(raftlock.InvalidArgument):
        client.lock(name, value=b"v" * (raftlock.VALUE_MAX_BYTES + 1), timeout=0).acquire()
    assert client.describe(name) is None
    with pytest.raises(raftlock.InvalidArgument):
        client.lock(name, value=12)


def test_semaphore_arguments_are_checked(client, name):
    with client.lock(name, capacity=raftlock.CAPACITY_MAX, weight=raftlock.CAPACITY_MAX, timeout=0):
        pass
    with client.session() as s:
        for capacity, weight in ((raftlock.CAPACITY_MAX + 1, 1), (3, 0), (3, 4), (0, 0)):
            with pytest.raises(raftlock.InvalidArgument):
                s.acquire(name, capacity=capacity, weight=weight, timeout=0)
        for capacity, weight in ((2**32, 1), (-1, 1), (3, 1.5), (3, True)):
            with pytest.raises(raftlock.InvalidArgument):
                s.acquire(name, capacity=capacity, weight=weight)
        with pytest.raises(raftlock.InvalidArgument):
            s.acquire(name, weight=2)  # weight without capacity
        with pytest.raises(raftlock.InvalidArgument):
            s.acquire(name, shared=True, capacity=2)
    assert client.describe(name) is None


def test_timeouts_and_graces_are_checked(client, name):
    for bad in (-0.001, float("inf"), "1"):
        with pytest.raises(raftlock.InvalidArgument):
            client.lock(name, timeout=bad)
    client.lock(name, end_on_disconnect=raftlock.END_ON_DISCONNECT_MAX)
    for bad in (raftlock.END_ON_DISCONNECT_MAX + 0.001, -1):
        with pytest.raises(raftlock.InvalidArgument):
            client.lock(name, end_on_disconnect=bad)
    for bad in (-0.1, 0.6):
        with pytest.raises(raftlock.InvalidArgument):
            client.session(margin=bad)


@pytest.mark.parametrize("endpoints", ["", " , ", "localhost", "host:port", "host:0", "host:70000", 12, [1]])
def test_bad_endpoints_are_refused(endpoints):
    with pytest.raises(raftlock.ConfigError):
        raftlock.Client(endpoints)


def test_endpoints_as_list_or_string():
    assert raftlock.Client(["a:1", " b:2 "]).endpoints == ("a:1", "b:2")
    assert raftlock.Client("http://a:1,b:2/").endpoints == ("a:1", "b:2")


def test_bad_credentials_are_refused(tmp_path):
    for token in ("", "with space", "tab\tx", "é", 5):
        with pytest.raises(raftlock.ConfigError):
            raftlock.Client("a:1", token=token)
    with pytest.raises(raftlock.ConfigError, match="cert and key"):
        raftlock.Client("a:1", ca=b"x", cert=b"x")
    with pytest.raises(raftlock.ConfigError, match="needs TLS"):
        raftlock.Client("a:1", cert=b"x", key=b"y")
    with pytest.raises(raftlock.ConfigError, match="cannot read"):
        raftlock.Client("a:1", ca=str(tmp_path / "missing.pem"))


def test_nothing_listening_fails_fast_with_unavailable():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    c = raftlock.Client(f"127.0.0.1:{port}")
    started = time.monotonic()
    with pytest.raises(raftlock.Unavailable, match="refused"):
        c.lock("x", timeout=0).acquire()
    assert time.monotonic() - started < _core.RETRY_DEADLINE
    c.close()


def test_a_closed_client_refuses_work(cluster, name):
    c = raftlock.Client(cluster.endpoints)
    c.close()
    with pytest.raises(raftlock.RaftlockError, match="closed"):
        c.lock(name).acquire()


# ------------------------------------------------------ the client's duties

def test_leader_hints_are_followed_without_sleeping(cluster, name, monkeypatch):
    """Endpoints that list only followers: the first request is forwarded
    to the leader by the follower, whose answer names the leader; the
    client goes to the leader directly from then on, and never sleeps on
    the way."""
    leader = cluster.leader()
    followers = [a for a in cluster.addrs if a != leader]
    slept = []
    monkeypatch.setattr(_sync.time, "sleep", lambda s: slept.append(s))
    c = raftlock.Client(followers)
    try:
        with c.lock(name, timeout=0) as lock:
            assert lock.fence
        assert c._t.endpoints.target() == leader
    finally:
        c.close()
    assert slept == []


def test_an_acquire_whose_answer_is_lost_is_cancelled(client, name, monkeypatch):
    """The cluster grants an acquire but its answer never reaches the
    client (as when a connection drops after the grant): the client does
    not know the outcome, so it withdraws the acquire with Cancel, and the
    grant is released rather than held by a session nobody uses."""
    session = client.session(ttl=30)
    real = client._t.call

    def lose_acquire_answers(method, request, *a, **kw):
        resp = real(method, request, *a, **kw)
        if method == "Acquire":
            assert resp.acquired  # the cluster did grant it
            raise raftlock.OutcomeUnknown("the answer was lost")
        return resp

    monkeypatch.setattr(client._t, "call", lose_acquire_answers)
    with pytest.raises(raftlock.OutcomeUnknown):
        session.acquire(name, timeout=0)
    monkeypatch.undo()
    assert client.describe(name) is None  # withdrawn: no holder
    session.acquire(name, timeout=0).release()  # the session lives on
    session.close()


def test_a_queued_acquire_whose_answer_is_lost_leaves_the_queue(client, name, monkeypatch):
    session = client.session(ttl=30)
    real = client._t.call

    def lose_a_queued_acquire(method, request, *a, **kw):
        if method != "Acquire":
            return real(method, request, *a, **kw)
        fut = client._t.stub(client._t.endpoints.target()).Acquire.future(request, timeout=30)
        wait_for(lambda: client.describe(name).waiters, "the acquire to queue")
        fut.cancel()  # the call breaks while the acquire is queued
        raise raftlock.OutcomeUnknown("the call broke")

    with client.lock(name):
        monkeypatch.setattr(client._t, "call", lose_a_queued_acquire)
        with pytest.raises(raftlock.OutcomeUnknown):
            session.acquire(name)
        monkeypatch.undo()
        assert not client.describe(name).waiters
    assert client.describe(name) is None  # never granted to the session
    session.close()
