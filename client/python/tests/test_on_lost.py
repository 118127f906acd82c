"""The lost-lock notice: ``on_lost(name, fence)``, given to the client, is
called once for each lock held when its lease may have lapsed (as Go's
``Options.OnLost``), in the sync and the asyncio client. The lease is ended
from outside, by the operator's ``RevokeSession`` over HTTP/JSON."""

import asyncio
import queue
import threading

import pytest

import raftlock
import raftlock.aio
from conftest import revoke_session, wait_for


def revoke(cluster, session_id: int) -> None:
    """Ends ``session_id`` as an operator would (at the leader)."""
    revoke_session(cluster.leader, session_id)


def test_on_lost_is_called_once_for_each_lock_held_when_the_lease_lapses(cluster, name):
    seen: "queue.Queue" = queue.Queue()
    with raftlock.Client(cluster.endpoints, on_lost=lambda n, f: seen.put((n, f))) as c:
        own = c.lock(name + "/own", ttl=3)
        own.acquire()
        with c.session(ttl=3) as s:
            a = s.acquire(name + "/a")
            b = s.acquire(name + "/b", shared=True)
            gone = s.acquire(name + "/released")
            gone.release()
            revoke(cluster, s.id)
            got = {seen.get(timeout=15), seen.get(timeout=15)}
            assert got == {(a.name, a.fence), (b.name, b.fence)}
            assert a.lost and b.lost
            with pytest.raises(queue.Empty):
                seen.get(timeout=1.5)  # once each; not the released one
        # The lock with a session of its own is still held and not lost.
        assert own.held and not own.lost
        revoke(cluster, own.session.id)
        assert seen.get(timeout=15) == (own.name, own.fence)
        assert own.lost
    with pytest.raises(queue.Empty):
        seen.get(timeout=0.5)


def test_a_failing_on_lost_does_not_stop_the_keep_alive(cluster, name):
    called = threading.Event()

    def boom(n, f):
        called.set()
        raise RuntimeError("the callback failed")

    with raftlock.Client(cluster.endpoints, on_lost=boom) as c:
        with c.session(ttl=3) as doomed, c.session(ttl=3) as kept:
            doomed.acquire(name + "/doomed")
            held = kept.acquire(name + "/kept")
            revoke(cluster, doomed.id)
            assert called.wait(15)
            # The keep-alive goes on renewing the other session.
            until = kept._lease.until
            wait_for(lambda: kept._lease.until > until + 1.0, "the kept session renewed after the failed callback")
            assert not held.lost
            assert c.describe(name + "/kept").holders[0].fence == held.fence


def test_on_lost_is_not_a_callable():
    with pytest.raises(raftlock.ConfigError):
        raftlock.Client("127.0.0.1:1", on_lost=42)
    with pytest.raises(raftlock.ConfigError):
        raftlock.aio.Client("127.0.0.1:1", on_lost=42)


def test_the_asyncio_client_calls_on_lost_plain_or_async(cluster, name):
    async def main():
        seen: "asyncio.Queue" = asyncio.Queue()

        async def notice(n, f):
            await seen.put((n, f))

        async with raftlock.aio.Client(cluster.endpoints, on_lost=notice) as c:
            async with c.session(ttl=3) as s:
                a = await s.acquire(name + "/a")
                await asyncio.get_running_loop().run_in_executor(None, revoke, cluster, s.id)
                assert await asyncio.wait_for(seen.get(), 15) == (a.name, a.fence)
                assert a.lost
        plain: "queue.Queue" = queue.Queue()
        async with raftlock.aio.Client(cluster.endpoints, on_lost=lambda n, f: plain.put((n, f))) as c:
            lock = c.lock(name + "/plain", ttl=3)
            await lock.acquire()
            await asyncio.get_running_loop().run_in_executor(None, revoke, cluster, lock.session.id)
            got = await asyncio.get_running_loop().run_in_executor(None, plain.get, True, 15)
            assert got == (lock.name, lock.fence)

    asyncio.run(asyncio.wait_for(main(), 90))
