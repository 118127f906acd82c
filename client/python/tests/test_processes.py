"""The seed users' stories with real processes: a holder killed, a queued
waiter killed, a holder paused past its ttl. Each worker runs
``tests/child.py`` with the package's default ``end_on_disconnect``."""

import signal
import threading
import time

import pytest

import raftlock

from conftest import wait_for

APIS = ["sync", "aio"]
# A ttl far longer than what the stories allow: the lock must come free
# because the process died, not because its lease ran out.
LONG_TTL = 30.0


def waiters_of(client, name):
    info = client.describe(name)
    return [] if info is None else list(info.waiters)


def holders_of(client, name):
    info = client.describe(name)
    return [] if info is None else list(info.holders)


@pytest.mark.parametrize("api", APIS)
def test_a_killed_holder_frees_the_lock_long_before_its_ttl(cluster, client, children, name, api):
    """A holder process at the client's defaults (``end_on_disconnect``
    0.75 s) with a 30 s ttl, SIGKILLed while this process waits for the
    lock: the waiter is granted long before the ttl (asserted: under 10 s;
    each round's kill-to-grant time is printed, ``pytest -s`` shows it).
    Three rounds."""
    took = []
    for round_ in range(3):
        key = f"{name}/{round_}"
        holder = children("hold", api, cluster.endpoints, key, str(LONG_TTL))
        fence = int(holder.expect("held").split()[1])
        got = {}

        def wait():
            with client.lock(key, ttl=10, timeout=LONG_TTL) as lock:
                got["at"] = time.monotonic()
                got["fence"] = lock.fence

        t = threading.Thread(target=wait)
        t.start()
        wait_for(lambda: waiters_of(client, key), "the waiter to queue")
        killed = time.monotonic()
        holder.signal(signal.SIGKILL)
        t.join(LONG_TTL)
        assert "at" in got, "the waiter was never granted"
        took.append(got["at"] - killed)
        assert took[-1] < 10.0, f"round {round_}: granted {took[-1]:.2f} s after the kill (ttl {LONG_TTL:g} s)"
        assert got["fence"] > fence
    figures = ", ".join(f"{d:.3f}" for d in took)
    print(f"\n{api}: SIGKILLed holder (ttl {LONG_TTL:g} s, default grace {raftlock.DEFAULT_END_ON_DISCONNECT:g} s)"
          f" -> next grant after {figures} s (median {sorted(took)[1]:.3f} s)")


@pytest.mark.parametrize("api", APIS)
def test_a_killed_queued_waiter_is_withdrawn_long_before_its_ttl(cluster, client, children, name, api):
    first = client.lock(name, ttl=10)
    assert first.acquire()
    dead = children("wait", api, cluster.endpoints, name, str(LONG_TTL))
    dead.expect("waiting")
    wait_for(lambda: len(waiters_of(client, name)) == 1, "the doomed waiter to queue")
    dead_session = waiters_of(client, name)[0].session_id
    live = children("wait", api, cluster.endpoints, name, str(LONG_TTL))
    wait_for(lambda: len(waiters_of(client, name)) == 2, "the live waiter to queue behind it")
    killed = time.monotonic()
    dead.signal(signal.SIGKILL)
    # The dead waiter's wait is withdrawn when its session ends with its
    # stream, long before its ttl.
    wait_for(lambda: dead_session not in [w.session_id for w in waiters_of(client, name)],
             "the dead waiter to leave the queue", timeout=LONG_TTL / 3)
    assert time.monotonic() - killed < LONG_TTL / 3
    first.release()
    live.expect("held", timeout=10)
    assert [h.session_id for h in holders_of(client, name)] != [dead_session]


@pytest.mark.parametrize("api", APIS)
def test_a_killed_queued_waiter_never_holds_up_the_next_when_released_at_once(cluster, client, children, name, api):
    """The release comes right after the kill, before the grace: the dead
    waiter's session may be granted, then ends with its stream, and the
    live waiter behind it gets the lock within seconds (asserted: under
    10 s), not the dead one's ttl. Three rounds; the time from the kill to
    the live waiter's grant and the median are printed."""
    took = []
    for round_ in range(3):
        key = f"{name}/{round_}"
        first = client.lock(key, ttl=10)
        assert first.acquire()
        dead = children("wait", api, cluster.endpoints, key, str(LONG_TTL))
        wait_for(lambda: len(waiters_of(client, key)) == 1, "the doomed waiter to queue")
        live = children("wait", api, cluster.endpoints, key, str(LONG_TTL))
        wait_for(lambda: len(waiters_of(client, key)) == 2, "the live waiter to queue behind it")
        dead.signal(signal.SIGKILL)
        killed = time.monotonic()
        first.release()
        live.expect("held", timeout=LONG_TTL / 3)
        took.append(time.monotonic() - killed)
        assert took[-1] < 10, f"round {round_}: the live waiter was granted {took[-1]:.3f} s after the kill"
    figures = ", ".join(f"{d:.3f}" for d in took)
    print(f"\n{api}: SIGKILLed queued waiter (ttl {LONG_TTL:g} s, default grace "
          f"{raftlock.DEFAULT_END_ON_DISCONNECT:g} s), holder released at once -> the waiter behind it granted "
          f"after {figures} s (median {sorted(took)[1]:.3f} s)")


@pytest.mark.parametrize("api", APIS)
def test_a_holder_paused_past_its_ttl_sees_lost_on_resume(cluster, client, children, name, api):
    ttl = 2.0
    holder = children("pause", api, cluster.endpoints, name, str(ttl))
    fence = int(holder.expect("held").split()[1])
    holder.signal(signal.SIGSTOP)
    try:
        # While it sleeps, its lease runs out on the cluster and the lock
        # goes to someone else.
        with client.lock(name, ttl=10, timeout=ttl * 5) as other:
            assert other.fence > fence
    finally:
        holder.signal(signal.SIGCONT)
    line = holder.expect("resumed")
    assert "lost=True" in line, line


@pytest.mark.parametrize("api", APIS)
def test_a_holder_paused_until_the_node_drops_its_connection_sees_lost_on_resume(cluster, client, children, name,
                                                                                 api):
    """A 30 s ttl, but the process is paused long enough for the node to
    give up on its connection (its HTTP/2 pings go unanswered): the session
    ends a grace later and the lock goes to someone else, long before the
    ttl. On resume the holder must not believe its lease for the rest of
    the ttl: its first look says not valid (jeopardy: within the ttl count
    it is not lost yet), and its next keep-alive, answered expired, makes
    it lost."""
    holder = children("pause", api, cluster.endpoints, name, str(LONG_TTL))
    fence = int(holder.expect("held").split()[1])
    holder.signal(signal.SIGSTOP)
    try:
        with client.lock(name, ttl=10, timeout=LONG_TTL * 0.8) as other:
            assert other.fence > fence
    finally:
        holder.signal(signal.SIGCONT)
    line = holder.expect("resumed")
    assert "valid=False" in line, line
    holder.expect("lost")


def test_an_interrupted_wait_is_withdrawn_and_the_session_kept(cluster, client, children, name):
    """Ctrl-C in a blocking ``session.acquire``: the client cancels the
    acquire (``Cancel``), so the interrupted wait is never granted to a
    session nobody waits on."""
    with client.lock(name, ttl=10):
        child = children("interrupt", "sync", cluster.endpoints, name, str(LONG_TTL))
        session = int(child.expect("session").split()[1])
        wait_for(lambda: [w.session_id for w in waiters_of(client, name)] == [session], "the child to queue")
        child.signal(signal.SIGINT)
        # The child prints once its Cancel is answered (or has given up
        # after the client's 15 s retry deadline): a deadline past that.
        child.expect("interrupted", timeout=60)
        wait_for(lambda: not waiters_of(client, name), "the wait to be withdrawn")
    # The child's session lives on (it sleeps) and nothing was granted to it.
    assert not holders_of(client, name)
    assert raftlock.Client  # the package imported in this process too
