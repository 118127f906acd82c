"""The asyncio client against the real cluster. Each test runs its own
event loop (``asyncio.run``), so the suite needs no asyncio plugin."""

import asyncio
import time

import pytest

import raftlock
import raftlock.aio


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_async_with_lock_holds_and_releases(cluster, name):
    async def main():
        async with raftlock.aio.Client(cluster.endpoints) as c:
            async with c.lock(name, ttl=5, timeout=5) as lock:
                assert isinstance(lock.fence, int) and lock.held and not lock.lost
                assert (await c.describe(name)).holders[0].fence == lock.fence
                assert await c.check_fence(name, lock.fence)
            assert await c.describe(name) is None
            assert await lock.release() is False

    run(main())


def test_redis_fair_lock_shape_acquire_returns_a_bool(cluster, name):
    async def main():
        async with raftlock.aio.Client(cluster.endpoints) as c:
            held = c.lock(name, timeout=0)
            assert await held.acquire() is True
            busy = c.lock(name, timeout=0)
            assert await busy.acquire() is False
            assert busy.held is False and busy.lost is False
            with pytest.raises(raftlock.NotAcquired):
                async with c.lock(name, timeout=0.2):
                    pass
            assert not (await c.describe(name)).waiters
            assert await held.release() is True
            assert await held.release() is False

    run(main())


def test_waiters_queue_fifo_without_polling(cluster, name):
    async def main():
        async with raftlock.aio.Client(cluster.endpoints) as c:
            order = []

            async def worker(i):
                async with c.lock(name, timeout=30) as lock:
                    order.append((i, lock.fence))
                    await asyncio.sleep(0.05)

            first = c.lock(name)
            await first.acquire()
            tasks = []
            for i in range(3):
                tasks.append(asyncio.create_task(worker(i)))
                while len((await c.describe(name)).waiters) < i + 1:
                    await asyncio.sleep(0.02)
            await first.release()
            await asyncio.gather(*tasks)
            assert [i for i, _ in order] == [0, 1, 2]

    run(main())


def test_a_cancelled_wait_is_withdrawn(cluster, name):
    async def main():
        async with raftlock.aio.Client(cluster.endpoints) as c:
            async with c.lock(name):
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(c.lock(name).acquire(), 0.5)
                assert not (await c.describe(name)).waiters
            assert await c.describe(name) is None

    run(main())


def test_a_cancelled_session_acquire_is_cancelled_and_the_session_kept(cluster, name):
    async def main():
        async with raftlock.aio.Client(cluster.endpoints) as c:
            async with c.session(ttl=10) as s:
                async with c.lock(name):
                    task = asyncio.create_task(s.acquire(name))
                    while not (await c.describe(name)).waiters:
                        await asyncio.sleep(0.02)
                    task.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await task
                    assert not (await c.describe(name)).waiters
                # The session goes on, and may take the name again at once.
                async with s.acquire(name, timeout=1) as lock:
                    assert lock.session is s
            assert await c.describe(name) is None

    run(main())


def test_sessions_semaphores_and_refusals(cluster, name):
    async def main():
        async with raftlock.aio.Client(cluster.endpoints) as c:
            s1 = await c.session(ttl=5)
            a = await s1.acquire(name, capacity=2, weight=2)
            async with c.session() as s2:
                with pytest.raises(raftlock.NotAcquired):
                    await s2.acquire(name, capacity=2, timeout=0)
                with pytest.raises(raftlock.FailedPrecondition):
                    await s2.acquire(name, capacity=3, timeout=0)
            with pytest.raises(raftlock.FailedPrecondition):
                await s1.acquire(name, capacity=2, timeout=0)
            assert await a.release() is True
            assert await s1.close() == 0
            with pytest.raises(raftlock.InvalidArgument):
                await c.lock("x" * (raftlock.NAME_MAX_BYTES + 1), timeout=0).acquire()
            with pytest.raises(raftlock.InvalidArgument):
                c.lock(name, ttl=0.5)

    run(main())


def test_the_lease_is_kept_alive_past_its_ttl(cluster, name):
    async def main():
        async with raftlock.aio.Client(cluster.endpoints) as c:
            async with c.lock(name, ttl=1.0) as lock:
                end = time.monotonic() + 2.5
                while time.monotonic() < end:
                    assert not lock.lost
                    await asyncio.sleep(0.1)
                assert await c.check_fence(name, lock.fence)

    run(main())


def test_a_closed_client_ends_its_sessions_with_the_stream(cluster, client, name):
    async def main():
        c = raftlock.aio.Client(cluster.endpoints)
        s = await c.session(ttl=30, end_on_disconnect=0.3)
        await s.acquire(name)
        await c.close()  # no CloseSession: the stream just closes

    run(main())
    deadline = time.monotonic() + 10
    while client.describe(name) is not None:
        assert time.monotonic() < deadline, "the session outlived its stream by 10 s"
        time.sleep(0.05)


def test_leader_election(cluster, name):
    async def main():
        async with raftlock.aio.Client(cluster.endpoints) as c:
            assert await c.leader(name) is None
            async with c.lock(name, value=b"me") as lock:
                assert await c.leader(name) == (b"me", lock.fence)

    run(main())
