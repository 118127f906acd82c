"""The three states of a held lock: held (``lock.valid``), jeopardy (the
grace count ran out, the ttl count did not: ``valid`` False, ``lost``
False, no ``on_lost``, renewals go on) and lost (final: the cluster said
the session ended, or no keep-alive was answered within the ttl count).
Three ``raftlockd run`` processes, so that the leader, or every node, can
die."""

import asyncio
import queue
import time

import pytest

import raftlock
import raftlock.aio
from conftest import RunCluster, wait_for

# Elections that take 3-4 s: a failover far longer than the default grace
# (0.75 s), far shorter than the 30 s ttl of the tests' locks.
SLOW_ELECTIONS = ["--election-timeout-min-ms", "3000", "--election-timeout-max-ms", "4000"]


@pytest.fixture
def slow_cluster(tmp_path):
    c = RunCluster(tmp_path, extra=SLOW_ELECTIONS)
    try:
        c.wait_ready(timeout=60)
        yield c
    finally:
        c.stop()


@pytest.fixture
def run_cluster(tmp_path):
    c = RunCluster(tmp_path)
    try:
        c.wait_ready()
        yield c
    finally:
        c.stop()


def kill_leader(c):
    """SIGKILLs the leader; the addresses of the other nodes."""
    old = wait_for(c.leader, "a leader", timeout=30)
    c.kill(old)
    return [a for a in c.addrs if a != old]


def test_a_failover_is_jeopardy_not_loss(slow_cluster):
    c = slow_cluster
    noticed: "queue.Queue" = queue.Queue()
    with raftlock.Client(c.addrs, on_lost=lambda n, f: noticed.put((n, f))) as client:
        lock = client.lock("jeopardy/failover", ttl=30)
        assert lock.acquire()
        assert lock.valid and not lock.lost
        survivors = kill_leader(c)
        wait_for(lambda: not lock.valid, "jeopardy (valid False) while no node leads", timeout=20)
        assert not lock.lost, "reported lost in jeopardy"
        assert noticed.empty(), f"on_lost called in jeopardy: {noticed.get()}"
        wait_for(lambda: c.leader(survivors), "a new leader", timeout=60, every=0.1)

        def held_again():
            assert not lock.lost, "reported lost across the failover"
            return lock.valid

        wait_for(held_again, "held again (valid) after the new leader renewed it", timeout=30)
        assert noticed.empty(), f"on_lost called across the failover: {noticed.get()}"
        assert client.check_fence(lock.name, lock.fence)
        assert lock.release() is True


def test_a_failover_is_jeopardy_not_loss_aio(slow_cluster):
    c = slow_cluster

    async def until(cond, what, timeout):
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.02)

    async def run():
        noticed = []
        async with raftlock.aio.Client(c.addrs, on_lost=lambda n, f: noticed.append((n, f))) as client:
            lock = client.lock("jeopardy/failover-aio", ttl=30)
            assert await lock.acquire()
            assert lock.valid and not lock.lost
            survivors = await asyncio.to_thread(kill_leader, c)
            await until(lambda: not lock.valid, "jeopardy (valid False) while no node leads", 20)
            assert not lock.lost, "reported lost in jeopardy"
            assert not noticed, f"on_lost called in jeopardy: {noticed}"
            await asyncio.to_thread(wait_for, lambda: c.leader(survivors), "a new leader", 60, 0.1)

            def held_again():
                assert not lock.lost, "reported lost across the failover"
                return lock.valid

            await until(held_again, "held again (valid) after the new leader renewed it", 30)
            assert not noticed, f"on_lost called across the failover: {noticed}"
            assert await client.check_fence(lock.name, lock.fence)
            assert await lock.release() is True

    asyncio.run(asyncio.wait_for(run(), 180))


def test_no_keep_alive_answered_within_the_ttl_count_is_lost(run_cluster):
    """Every node dies: jeopardy once the grace count runs out, lost (and
    ``on_lost`` called, once) only when the ttl count has passed: when the
    last answer to a keep-alive came + the ttl - 10 %."""
    c = run_cluster
    noticed = []
    client = raftlock.Client(c.addrs, on_lost=lambda n, f: noticed.append((time.monotonic(), n, f)))
    try:
        lock = client.lock("jeopardy/ttl-count", ttl=3)
        assert lock.acquire()
        for a in c.addrs:
            c.kill(a)
        wait_for(lambda: not lock.valid and not lock.lost, "jeopardy (valid False, lost False)", timeout=10)
        wait_for(lambda: lock.lost, "the lock lost", timeout=30)
        seen = time.monotonic()
        ttl_count = lock.session._lease.lost_at
        assert seen >= ttl_count, f"lost {ttl_count - seen:.3f} s before the ttl count ran out"
        wait_for(lambda: noticed, "on_lost", timeout=10)
        at, name, fence = noticed[0]
        assert (name, fence) == (lock.name, lock.fence)
        assert at >= ttl_count, f"on_lost called {ttl_count - at:.3f} s before the ttl count ran out"
        assert lock.lost and not lock.valid
        # Renewals stop, and on_lost was called once.
        wait_for(lambda: lock.session.id not in client._ka.r.entries, "renewals to stop", timeout=10)
        assert len(noticed) == 1, noticed
    finally:
        client.close()
