"""A leader killed with SIGKILL under a held lock and a waiting acquire:
three ``raftlockd run`` processes, so one can die."""

import signal
import threading

import pytest

import raftlock

from conftest import RunCluster, wait_for


@pytest.fixture
def run_cluster(tmp_path):
    c = RunCluster(tmp_path)
    try:
        c.wait_ready()
        yield c
    finally:
        c.stop()


def test_a_lock_and_a_wait_survive_the_leaders_death(run_cluster):
    c = run_cluster
    client = raftlock.Client(c.addrs)
    name = "failover/lock"
    holder = client.lock(name, ttl=10)
    assert holder.acquire()
    waiter_session = client.session(ttl=10)
    got = {}

    def wait():
        try:
            got["lock"] = waiter_session.acquire(name, timeout=None)
        except Exception as e:  # noqa: BLE001 - reported below
            got["error"] = e

    t = threading.Thread(target=wait)
    t.start()
    wait_for(lambda: client.describe(name).waiters, "the waiter to queue")
    old = c.leader()
    c.procs[old].send_signal(signal.SIGKILL)
    c.procs[old].wait()
    survivors = [a for a in c.addrs if a != old]
    wait_for(lambda: c.leader(survivors), "a new leader", timeout=30, every=0.1)
    # The client follows the new leader; the session and its grant are there,
    # and the client's view comes back once its keep-alive is answered there.
    wait_for(lambda: not holder.lost, "the holder's view to hold again", timeout=10)
    assert client.check_fence(name, holder.fence)
    info = client.describe(name)
    assert [w.session_id for w in info.waiters] == [waiter_session.id]
    # The wait was re-sent with the same seq to the new leader: released
    # now, it is granted (a new seq would have been refused as a second
    # acquire of a name the session waits for).
    assert holder.release() is True
    t.join(20)
    assert "error" not in got, got.get("error")
    assert got["lock"].fence > holder.fence
    assert not got["lock"].lost
    waiter_session.close()
    client.close()



def test_a_failed_release_can_be_retried(run_cluster):
    """A release that failed (no node reachable) ends the holder's belief
    (``held`` is False), and calling ``release()`` again retries it: the
    grant does not stay held for as long as its session lives."""
    c = run_cluster
    client = raftlock.Client(c.addrs)
    session = client.session(ttl=60)
    lock = session.acquire("failover/release-retry")
    assert lock.held
    for a in c.addrs:
        c.kill(a)
    with pytest.raises(raftlock.Unavailable):
        lock.release()
    assert not lock.held
    for a in c.addrs:
        c.start(a)
    c.wait_ready()
    assert lock.release() is True, "the retry released the grant"
    assert client.describe("failover/release-retry") is None
    session.close()


def test_a_failed_release_can_be_retried_aio(run_cluster):
    import asyncio

    from raftlock import aio

    c = run_cluster

    async def run():
        client = aio.Client(c.addrs)
        session = await client.session(ttl=60)
        lock = await session.acquire("failover/release-retry-aio")
        assert lock.held
        for a in c.addrs:
            c.kill(a)
        with pytest.raises(raftlock.Unavailable):
            await lock.release()
        assert not lock.held
        for a in c.addrs:
            c.start(a)
        await asyncio.to_thread(c.wait_ready)
        assert await lock.release() is True, "the retry released the grant"
        assert await client.describe("failover/release-retry-aio") is None
        await session.close()
        await client.close()

    asyncio.run(run())
