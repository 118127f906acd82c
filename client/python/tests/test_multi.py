"""Atomic multi-locks (``Session.acquire_all``) and upgrade/downgrade
(``Lock.upgrade``, ``Lock.downgrade``), sync and asyncio, against the real
cluster."""

import asyncio
import threading
import time

import pytest

import raftlock
import raftlock.aio

from conftest import wait_for


def holders(client, name):
    info = client.describe(name)
    return [] if info is None else [(h.session_id, h.fence, h.mode) for h in info.holders]


def waiters(client, name):
    info = client.describe(name)
    return [] if info is None else [(w.session_id, w.mode) for w in info.waiters]


# ------------------------------------------------------------ acquire_all


def test_acquire_all_grants_every_name_at_once_each_with_its_own_fence(client, name):
    a, b, c = name + "/a", name + "/b", name + "/c"
    with client.session() as s:
        locks = s.acquire_all([a, {"name": b, "shared": True}, {"name": c, "capacity": 3, "weight": 2}], timeout=0)
        assert [lk.name for lk in locks] == [a, b, c]
        assert [lk.mode for lk in locks] == ["exclusive", "shared", "semaphore"]
        # One command: consecutive fences from the one counter, in order.
        first = locks[0].fence
        assert [lk.fence for lk in locks] == [first, first + 1, first + 2]
        assert holders(client, a) == [(s.id, first, "exclusive")]
        assert holders(client, b) == [(s.id, first + 1, "shared")]
        assert client.describe(c).holders[0].weight == 2
        assert all(lk.session is s and lk.held for lk in locks)
        assert [lk.release() for lk in locks] == [True, True, True]
        assert all(client.describe(n) is None for n in (a, b, c))


def test_acquire_all_is_all_or_nothing(client, name):
    a, b = name + "/a", name + "/b"
    with client.lock(b):
        with client.session() as s:
            with pytest.raises(raftlock.NotAcquired, match="not all free"):
                s.acquire_all([a, b], timeout=0)
            # Nothing held, nothing queued, on either name.
            assert client.describe(a) is None
            assert waiters(client, b) == []
            started = time.monotonic()
            with pytest.raises(raftlock.NotAcquired, match="not granted together"):
                s.acquire_all([a, b], timeout=0.3)
            assert time.monotonic() - started >= 0.3
            assert client.describe(a) is None and waiters(client, b) == []


def test_a_waiting_request_queues_on_every_name_and_lets_nobody_pass(client, name):
    a, b = name + "/a", name + "/b"
    holder = client.lock(b)
    assert holder.acquire()
    got = []
    with client.session() as s:
        t = threading.Thread(target=lambda: got.append(s.acquire_all([a, b], timeout=30)))
        t.start()
        wait_for(lambda: waiters(client, a) and waiters(client, b), "the request to queue on both names")
        # `a` is free, but the request waits in its queue: no barging.
        assert client.lock(a, timeout=0).acquire() is False
        assert waiters(client, a) == [(s.id, "exclusive")]
        holder.release()
        t.join(30)
        assert [lk.name for lk in got[0]] == [a, b]
        assert got[0][1].fence > holder.fence
        assert holders(client, a)[0][0] == holders(client, b)[0][0] == s.id


def test_atomic_requests_in_opposite_orders_never_deadlock(client, name):
    a, b, c = name + "/a", name + "/b", name + "/c"
    done = []

    def worker(order):
        with client.session() as s:
            for _ in range(8):
                for lk in s.acquire_all(order, timeout=30):
                    lk.release()
            done.append(order)

    threads = [threading.Thread(target=worker, args=(o,)) for o in ([a, b, c], [c, b, a], [b, a])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(done) == 3


def test_acquire_all_input_is_checked_at_its_edges(client, name):
    with client.session() as s:
        for bad in ([], "a-string", [name, name], [12], [{"name": name, "colour": 1}],
                    [{"shared": True}], [{"name": name, "weight": 2}]):
            with pytest.raises(raftlock.InvalidArgument):
                s.acquire_all(bad, timeout=0)
        too_many = [f"{name}/{i}" for i in range(raftlock.ACQUIRE_ALL_MAX + 1)]
        with pytest.raises(raftlock.InvalidArgument, match="1..=64"):
            s.acquire_all(too_many, timeout=0)
        assert client.describe(too_many[0]) is None
        # The cluster's own check of a name, for one of the request's.
        with pytest.raises(raftlock.InvalidArgument):
            s.acquire_all([name, "x" * (raftlock.NAME_MAX_BYTES + 1)], timeout=0)
        assert client.describe(name) is None
        # Exactly the limit is granted.
        locks = s.acquire_all(too_many[:-1], timeout=0)
        assert len(locks) == raftlock.ACQUIRE_ALL_MAX == 64
        assert s.close() == 64


def test_an_acquire_all_whose_answer_is_lost_is_cancelled(client, name, monkeypatch):
    a, b = name + "/a", name + "/b"
    session = client.session(ttl=30)
    real = client._t.call

    def lose_the_answer(method, request, *args, **kw):
        resp = real(method, request, *args, **kw)
        if method == "AcquireAll":
            assert resp.acquired  # the cluster did grant both
            raise raftlock.OutcomeUnknown("the answer was lost")
        return resp

    monkeypatch.setattr(client._t, "call", lose_the_answer)
    with pytest.raises(raftlock.OutcomeUnknown):
        session.acquire_all([a, b], timeout=0)
    monkeypatch.undo()
    # One Cancel withdrew the whole request: neither name is held.
    assert client.describe(a) is None and client.describe(b) is None
    assert len(session.acquire_all([a, b], timeout=0)) == 2  # the session lives on
    assert session.close() == 2


# ------------------------------------------------------ upgrade, downgrade


def test_a_lone_reader_upgrades_at_once_to_a_new_fence_and_downgrades_keeping_it(client, name):
    with client.session() as s:
        lock = s.acquire(name, shared=True)
        read_fence = lock.fence
        assert lock.upgrade(timeout=0) is lock
        assert lock.mode == "exclusive" and lock.fence > read_fence
        assert holders(client, name) == [(s.id, lock.fence, "exclusive")]
        assert not client.check_fence(name, read_fence)
        assert client.lock(name, shared=True, timeout=0).acquire() is False
        write_fence = lock.fence
        assert lock.downgrade() is lock
        assert lock.mode == "shared" and lock.fence == write_fence
        assert holders(client, name) == [(s.id, write_fence, "shared")]
        with client.lock(name, shared=True, timeout=0) as other:
            assert other.fence > write_fence
        assert lock.release() is True
    assert client.describe(name) is None


def test_an_upgrade_waits_for_the_other_readers_ahead_of_the_queue(client, name):
    with client.session() as s1, client.session() as s2, client.session() as s3:
        r1 = s1.acquire(name, shared=True)
        r2 = s2.acquire(name, shared=True)
        # Not alone: a try-once or a short wait fails, the read kept.
        with pytest.raises(raftlock.NotAcquired, match="other holders"):
            r1.upgrade(timeout=0)
        with pytest.raises(raftlock.NotAcquired, match="not upgraded within"):
            r1.upgrade(timeout=0.2)
        assert r1.mode == "shared" and r1.held
        assert sorted(holders(client, name)) == sorted([(s1.id, r1.fence, "shared"), (s2.id, r2.fence, "shared")])
        assert waiters(client, name) == []
        writer = []
        tw = threading.Thread(target=lambda: writer.append(s3.acquire(name, timeout=30)))
        tw.start()
        wait_for(lambda: waiters(client, name) == [(s3.id, "exclusive")], "a writer to queue")
        up = []
        tu = threading.Thread(target=lambda: up.append(r1.upgrade(timeout=30)))
        tu.start()
        # The upgrade waits ahead of the writer queued before it.
        wait_for(lambda: waiters(client, name) == [(s1.id, "exclusive"), (s3.id, "exclusive")],
                 "the upgrade to wait first")
        # A new reader cannot get in meanwhile either.
        assert client.lock(name, shared=True, timeout=0).acquire() is False
        r2.release()
        tu.join(30)
        assert up == [r1] and r1.mode == "exclusive" and r1.fence > r2.fence
        assert holders(client, name) == [(s1.id, r1.fence, "exclusive")]
        assert writer == []
        r1.release()
        tw.join(30)
        assert writer[0].fence > r1.fence


def test_two_readers_upgrading_one_lock_the_second_is_refused_at_once(client, name):
    with client.session() as s1, client.session() as s2:
        r1 = s1.acquire(name, shared=True)
        r2 = s2.acquire(name, shared=True)
        up = []
        t = threading.Thread(target=lambda: up.append(r1.upgrade(timeout=30)))
        t.start()
        wait_for(lambda: waiters(client, name) == [(s1.id, "exclusive")], "the first upgrade to wait")
        with pytest.raises(raftlock.Deadlock):
            r2.upgrade(timeout=30)
        # Refused, the read still held; giving it up lets the first in.
        assert r2.held and r2.mode == "shared"
        assert (s2.id, r2.fence, "shared") in holders(client, name)
        assert r2.release() is True
        t.join(30)
        assert up == [r1] and holders(client, name) == [(s1.id, r1.fence, "exclusive")]


def test_a_downgrade_lets_the_queued_readers_in(client, name):
    with client.session() as s1, client.session() as s2, client.session() as s3:
        w = s1.acquire(name)
        got = []
        threads = [threading.Thread(target=lambda s=s: got.append(s.acquire(name, shared=True, timeout=30)))
                   for s in (s2, s3)]
        for t in threads:
            t.start()
        wait_for(lambda: len(waiters(client, name)) == 2, "two readers to queue")
        w.downgrade()
        for t in threads:
            t.join(30)
        assert len(got) == 2 and all(g.fence > w.fence for g in got)
        assert sorted(h[2] for h in holders(client, name)) == ["shared"] * 3


def test_upgrade_and_downgrade_refuse_the_wrong_mode(client, name):
    with client.session() as s:
        w = s.acquire(name)
        with pytest.raises(raftlock.InvalidArgument, match="only a shared lock"):
            w.upgrade()
        r = s.acquire(name + "/r", shared=True)
        with pytest.raises(raftlock.InvalidArgument, match="only an exclusive lock"):
            r.downgrade()
        sem = s.acquire(name + "/s", capacity=2)
        with pytest.raises(raftlock.InvalidArgument):
            sem.upgrade()
        with pytest.raises(raftlock.InvalidArgument):
            sem.downgrade()
        r.release()
        with pytest.raises(raftlock.RaftlockError, match="not held"):
            r.upgrade()
        # Nothing changed on the cluster.
        assert holders(client, name) == [(s.id, w.fence, "exclusive")]
        assert client.describe(name + "/r") is None


def lose_upgrade_answers(client, monkeypatch, granted):
    """Throws away every Upgrade answer after the node applied it (checking
    it was ``granted`` or not), raising ``OutcomeUnknown`` instead."""
    real = client._t.call

    def lose_the_answer(method, request, *args, **kw):
        resp = real(method, request, *args, **kw)
        if method == "Upgrade":
            assert resp.acquired == granted
            raise raftlock.OutcomeUnknown("the answer was lost")
        return resp

    monkeypatch.setattr(client._t, "call", lose_the_answer)


def test_an_upgrade_whose_answer_is_lost_is_cancelled(client, name, monkeypatch):
    session = client.session(ttl=30)
    lock = session.acquire(name, shared=True)
    lose_upgrade_answers(client, monkeypatch, granted=True)
    with pytest.raises(raftlock.OutcomeUnknown):
        lock.upgrade(timeout=0)
    monkeypatch.undo()
    # Cancel released the upgraded grant (the read ended with the upgrade).
    assert client.describe(name) is None
    # The lock holds nothing, and says so; it cannot be upgraded again.
    assert not lock.valid
    with pytest.raises(raftlock.RaftlockError, match="ended"):
        lock.upgrade(timeout=0)
    session.close()


def test_an_upgrade_refused_and_unanswered_keeps_the_read(client, name, monkeypatch):
    session = client.session(ttl=30)
    other = client.session(ttl=30)
    other.acquire(name, shared=True)
    lock = session.acquire(name, shared=True)
    lose_upgrade_answers(client, monkeypatch, granted=False)
    with pytest.raises(raftlock.OutcomeUnknown):
        lock.upgrade(timeout=0)
    monkeypatch.undo()
    # Nothing was granted, so the Cancel withdrew nothing: the read is held.
    assert len(client.describe(name).holders) == 2
    assert lock.valid and lock.mode == "shared"
    other.close()
    assert lock.upgrade(timeout=0) is lock and lock.mode == "exclusive"
    session.close()


# ---------------------------------------------------------------- asyncio


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_async_upgrade_granted_and_unanswered_leaves_the_lock_not_valid(cluster, name):
    async def main():
        async with raftlock.aio.Client(cluster.endpoints) as c:
            async with c.session(ttl=30) as s:
                lock = await s.acquire(name, shared=True)
                real = c._t.call

                async def lose_the_answer(method, request, *args, **kw):
                    resp = await real(method, request, *args, **kw)
                    if method == "Upgrade":
                        assert resp.acquired
                        raise raftlock.OutcomeUnknown("the answer was lost")
                    return resp

                c._t.call = lose_the_answer
                with pytest.raises(raftlock.OutcomeUnknown):
                    await lock.upgrade(timeout=0)
                c._t.call = real
                assert await c.describe(name) is None
                assert not lock.valid
                with pytest.raises(raftlock.RaftlockError, match="ended"):
                    await lock.upgrade(timeout=0)

    run(main())


def test_async_acquire_all_and_upgrade_downgrade(cluster, name):
    a, b = name + "/a", name + "/b"

    async def main():
        async with raftlock.aio.Client(cluster.endpoints) as c:
            async with c.session() as s, c.session() as other:
                locks = await s.acquire_all([a, {"name": b, "shared": True}], timeout=0)
                assert [lk.mode for lk in locks] == ["exclusive", "shared"]
                assert locks[1].fence == locks[0].fence + 1
                with pytest.raises(raftlock.NotAcquired):
                    await other.acquire_all([b, a], timeout=0)
                assert len((await c.describe(a)).holders) == 1 and not (await c.describe(a)).waiters
                read = locks[1]
                old = read.fence
                assert await read.upgrade(timeout=0) is read
                assert read.mode == "exclusive" and read.fence > old
                await read.downgrade()
                assert read.mode == "shared"
                info = await c.describe(b)
                assert [(h.fence, h.mode) for h in info.holders] == [(read.fence, "shared")]
                # A waiting request is granted both names together.
                waiting = asyncio.ensure_future(other.acquire_all([b, a], timeout=30))
                while not (await c.describe(a)).waiters:
                    await asyncio.sleep(0.02)
                for lk in locks:
                    await lk.release()
                got = await waiting
                assert [lk.name for lk in got] == [b, a]
                with pytest.raises(raftlock.InvalidArgument):
                    await other.acquire_all([], timeout=0)

    run(main())


def test_async_second_upgrade_is_refused_and_a_cancelled_upgrade_is_withdrawn(cluster, name):
    async def main():
        async with raftlock.aio.Client(cluster.endpoints) as c:
            async with c.session() as s1, c.session() as s2:
                r1 = await s1.acquire(name, shared=True)
                r2 = await s2.acquire(name, shared=True)
                first = asyncio.ensure_future(r1.upgrade(timeout=30))
                while not (await c.describe(name)).waiters:
                    await asyncio.sleep(0.02)
                with pytest.raises(raftlock.Deadlock):
                    await r2.upgrade(timeout=30)
                # The waiting upgrade's task is cancelled: it is withdrawn,
                # and the read stays held.
                first.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await first
                while (await c.describe(name)).waiters:
                    await asyncio.sleep(0.02)
                info = await c.describe(name)
                assert sorted(h.mode for h in info.holders) == ["shared", "shared"]
                # The other reader gone, the first upgrades at once.
                assert await r2.release() is True
                assert await r1.upgrade(timeout=0) is r1 and r1.mode == "exclusive"

    run(main())
