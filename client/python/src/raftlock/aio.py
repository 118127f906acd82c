"""The asyncio client: the same names as the sync one, with coroutines.

    import raftlock.aio

    client = raftlock.aio.Client("127.0.0.1:7101,127.0.0.1:7102")
    async with client.lock("jobs/nightly", ttl=10.0, timeout=5.0) as lock:
        await store.write(data, fence=lock.fence)

    lock = client.lock("jobs/nightly", timeout=0)   # RedisFairLock's shape
    if await lock.acquire():
        try:
            ...
        finally:
            await lock.release()

One task per client keeps every session alive on one ``KeepAlive``
stream; the rules it follows are in ``raftlock._core``. A client belongs to
the event loop it is first used in. A cancelled acquire (``wait_for``, a
cancelled task) withdraws its wait before the cancellation goes on.
"""

from __future__ import annotations

import asyncio
import collections.abc
import inspect
import itertools
import logging
import random
from typing import Callable, List, Optional, Sequence, Set, Tuple, Union

import grpc
import grpc.aio

from . import _core as core
from . import errors
from ._core import Holder, LockInfo, Waiter  # noqa: F401 - re-exported
from .errors import NotAcquired  # noqa: F401 - re-exported
from .v1 import locks_pb2 as pb
from .v1 import locks_pb2_grpc as pbg

log = logging.getLogger("raftlock")

_REFUSALS = (
    errors.InvalidArgument,
    errors.FailedPrecondition,
    errors.Deadlock,
    errors.SessionNotFound,
    errors.ResourceExhausted,
    errors.Unauthenticated,
    errors.PermissionDenied,
)


class _Transport:
    """Channels to the nodes, credentials, and the retrying call."""

    def __init__(self, endpoints, token, ca, cert, key) -> None:
        self.endpoints = core.Endpoints(core.parse_endpoints(endpoints))
        self.metadata = core.auth_metadata(token)
        if (cert is None) != (key is None):
            raise errors.ConfigError("cert and key go together: give both or neither")
        ca_pem = core.read_pem("CA certificate", ca)
        cert_pem = core.read_pem("client certificate", cert)
        key_pem = core.read_pem("client key", key)
        if cert_pem is not None and ca_pem is None:
            raise errors.ConfigError("a client certificate needs TLS: give ca too")
        self.credentials = grpc.ssl_channel_credentials(ca_pem, key_pem, cert_pem) if ca_pem is not None else None
        self._channels = {}
        self.closed = False

    def stub(self, addr: str) -> pbg.LocksStub:
        if self.closed:
            raise errors.RaftlockError("the client is closed")
        got = self._channels.get(addr)
        if got is None:
            if self.credentials is not None:
                ch = grpc.aio.secure_channel(addr, self.credentials, options=core.CHANNEL_OPTIONS)
            else:
                ch = grpc.aio.insecure_channel(addr, options=core.CHANNEL_OPTIONS)
            got = (ch, pbg.LocksStub(ch))
            self._channels[addr] = got
        return got[1]

    async def call(self, method: str, request, write: bool, attempt=core.REQUEST_TIMEOUT, deadline=None):
        """``method`` at the leader, retried by the rules of ``core.Attempts``."""
        if deadline is None:
            deadline = core.deadline_after(core.RETRY_DEADLINE)
        attempts = core.Attempts(self.endpoints, write, deadline)
        while True:
            budget = attempts.budget(attempt)
            addr = self.endpoints.target()
            call = getattr(self.stub(addr), method)(request, timeout=budget, metadata=self.metadata)
            try:
                resp = await call
            except grpc.aio.AioRpcError as e:
                pause = attempts.failed(addr, e)
            else:
                try:
                    md = await call.initial_metadata()
                except Exception:  # noqa: BLE001 - metadata is a hint only
                    md = None
                attempts.succeeded(addr, md)
                return resp
            if pause:
                await asyncio.sleep(pause)

    async def close(self) -> None:
        self.closed = True
        channels, self._channels = self._channels, {}
        for ch, _ in channels.values():
            await ch.close()


class _Stream:
    def __init__(self, addr: str, call) -> None:
        self.addr = addr
        self.call = call


class _KeepAlive:
    """Every session of a client, kept alive on one stream by one task."""

    def __init__(self, transport: _Transport) -> None:
        self.t = transport
        self.r = core.Renewals()
        self.stream: Optional[_Stream] = None
        #: A stalled stream left open until the next one has renewed every
        #: session that ends with its stream (closing it first would start
        #: their grace on the leader with no stream renewing them).
        self.old: Optional[_Stream] = None
        self.retry_at = 0.0
        self.backoff = core.INITIAL_BACKOFF
        self.hops = 0
        self.task: Optional[asyncio.Task] = None
        self.readers: Set[asyncio.Task] = set()
        self.closed = False
        self._wake: Optional[asyncio.Event] = None
        self._answered: Optional[asyncio.Event] = None

    def _events(self) -> None:
        if self._wake is None:
            self._wake = asyncio.Event()
            self._answered = asyncio.Event()

    def _poke(self) -> None:
        self._events()
        self._wake.set()

    def add(self, lease: core.Lease, first: float) -> None:
        self._events()
        self.r.add(lease, first)
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._run(), name="raftlock-keepalive")
        self._poke()

    def remove(self, session_id: int) -> None:
        self.r.remove(session_id)
        self._poke()

    async def renew_now(self, lease: core.Lease, timeout: float) -> bool:
        """Renews ``lease`` at once; True once the answer came."""
        deadline = core.now() + timeout
        sid = lease.session_id
        if sid not in self.r.entries:
            return False
        before = self.r.renew_now(sid, core.now())
        self._poke()
        while True:
            e = self.r.entries.get(sid)
            if e is None:
                return False
            if e.answers > before:
                return True
            left = deadline - core.now()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(self._answered.wait(), left)
            except asyncio.TimeoutError:
                pass

    async def close(self) -> None:
        self.closed = True
        if self.stream is not None:
            self._drop(self.stream)
        self._close_old()
        for task in [self.task, *self.readers]:
            if task is not None:
                task.cancel()
        for task in [self.task, *self.readers]:
            if task is not None:
                try:
                    await task
                except BaseException:  # noqa: BLE001 - stopping
                    pass

    async def _run(self) -> None:
        while not self.closed:
            self._wake.clear()
            t = core.now()
            self.r.prune(t)
            if self.stream is not None and self.r.overdue(t):
                # Nothing came back since an ask was sent: the leader may be
                # gone with the connection still up, or slow. Try another
                # stream; this one stays open until that one has renewed
                # the sessions.
                self.t.endpoints.forget(self.stream.addr)
                self._leave(self.stream)
            for lease in self.r.take_lost(t):
                if lease.on_lost is not None:
                    lease.on_lost()
            if not self.r.entries:
                if self.stream is not None:
                    st, self.stream = self.stream, None
                    await self._end(st)
                await self._wake.wait()
                continue
            if self.stream is None and t >= self.retry_at:
                self._open()
            if self.stream is not None:
                st = self.stream
                for ask in self.r.due(t):
                    try:
                        await st.call.write(pb.KeepAliveRequest(session_id=ask.session_id, ask_id=ask.ask_id))
                    except Exception:  # noqa: BLE001 - the reader sees the stream end
                        break
            wake = self.r.next_wakeup(t)
            if self.stream is None:
                wake = self.retry_at if wake is None else min(wake, self.retry_at)
            try:
                timeout = None if wake is None else max(0.0, wake - core.now())
                await asyncio.wait_for(self._wake.wait(), timeout)
            except asyncio.TimeoutError:
                pass

    def _open(self) -> None:
        addr = self.t.endpoints.target()
        try:
            call = self.t.stub(addr).KeepAlive(metadata=self.t.metadata)
        except errors.RaftlockError:
            self.closed = True
            return
        st = _Stream(addr, call)
        self.stream = st
        self.r.stream_opened(core.now())
        reader = asyncio.get_running_loop().create_task(self._read(st), name="raftlock-keepalive-read")
        self.readers.add(reader)
        reader.add_done_callback(self.readers.discard)

    async def _end(self, st: _Stream) -> None:
        try:
            await st.call.done_writing()
        except Exception:  # noqa: BLE001 - ending anyway
            st.call.cancel()

    def _drop(self, st: _Stream) -> None:
        if self.stream is st:
            self.stream = None
        st.call.cancel()
        self.r.stream_failed(core.now())

    def _leave(self, st: _Stream) -> None:
        """Leaves the stalled stream ``st`` open for the next one (its asks
        are retried there; its late answers are not credited). If an older
        stalled stream is still open (nothing renewed since it was left),
        that one stays (it carried the sessions: closing it would start
        their grace with no stream renewing them) and the newer ``st`` is
        closed instead."""
        if self.old is None:
            self.stream, self.old = None, st
        else:
            self.stream = None
            st.call.cancel()
        self.r.stream_failed(core.now())
        self.retry_at = core.now() + self.backoff * random.uniform(0.5, 1.5)
        self.backoff = min(self.backoff * 2, core.MAX_BACKOFF)

    def _close_old(self) -> None:
        if self.old is not None:
            old, self.old = self.old, None
            old.call.cancel()

    async def _read(self, st: _Stream) -> None:
        err = None
        try:
            while True:
                resp = await st.call.read()
                if resp is grpc.aio.EOF:
                    break
                if st is self.old:
                    continue  # left for a newer stream: open, not credited
                if self.stream is not st:
                    break
                self.r.answer(resp.session_id, resp.ask_id, resp.ttl_ms, resp.expired, core.now())
                if self.r.all_bound():
                    self._close_old()
                # The keep-alive task looks again: the session's next
                # renewal is due from this answer (or, if it expired, its
                # holders are told, on_lost).
                self._wake.set()
                self.backoff = core.INITIAL_BACKOFF
                self.hops = 0
                done, self._answered = self._answered, asyncio.Event()
                done.set()
        except grpc.aio.AioRpcError as e:
            err = e
        except asyncio.CancelledError:
            if self.closed or self.stream is not st:
                return
            raise
        if self.old is st:
            self.old = None  # the left stream ended by itself
            st.call.cancel()
            return
        if self.stream is not st:
            return
        self.stream = None
        st.call.cancel()
        md = core.status_of(err)[2] if err is not None else {}
        self.r.stream_failed(core.now())
        hint = md.get(core.LEADER_KEY)
        if hint and hint != st.addr and self.hops < 3:
            self.hops += 1
            self.t.endpoints.set_leader(hint)
            self.retry_at = core.now()
        else:
            self.hops = 0
            self.t.endpoints.forget(st.addr)
            self.retry_at = core.now() + self.backoff * random.uniform(0.5, 1.5)
            self.backoff = min(self.backoff * 2, core.MAX_BACKOFF)
        if err is not None:
            log.debug("keep-alive stream to %s ended: %s", st.addr, core.status_of(err)[:2])
        self._poke()


class _Pending(collections.abc.Coroutine):
    """What ``Client.session()`` and ``Session.acquire()`` return: a
    coroutine (await it, or make it a task), or an ``async with`` context
    (which closes or releases at the end)."""

    def __init__(self, coro) -> None:
        self._coro = coro
        self._value = None

    def __await__(self):
        return self._coro.__await__()

    def send(self, value):
        return self._coro.send(value)

    def throw(self, *args):
        return self._coro.throw(*args)

    def close(self):
        return self._coro.close()

    async def __aenter__(self):
        self._value = await self._coro
        return await self._value.__aenter__()

    async def __aexit__(self, *exc):
        return await self._value.__aexit__(*exc)


def _wait_budget(timeout: Optional[float], wait: bool) -> Tuple[float, float]:
    """``(attempt, deadline)`` of a request that may wait ``timeout``."""
    if wait:
        return core.FOREVER_ATTEMPT, float("inf")
    t = float(timeout)
    return core.REQUEST_TIMEOUT + 2 * t, core.deadline_after(core.RETRY_DEADLINE + 2 * t)


class Lock:
    """A lock or semaphore permits: either a lock with a session of its own
    (from :meth:`Client.lock`, taken by ``await lock.acquire()`` or
    ``async with``), or a grant in a session (from ``await
    session.acquire(...)``, already held). ``fence``, ``valid``, ``lost``
    and ``held`` are plain attributes; ``await lock.release()`` is safe to
    call any number of times."""

    def __init__(self, client, name, *, ttl, timeout, shared, capacity, weight, value, margin, end_on_disconnect,
                 session=None) -> None:
        self.name = core.check_name(name)
        self._client = client
        self._timeout = timeout
        core.timeout_fields(timeout)
        self._mode = core.mode_fields(shared, capacity, weight)
        self._value = core.check_value(value)
        self._session = session
        self._own = session is None
        if self._own:
            self._ttl = ttl
            core.ttl_ms(ttl)
            self._margin = core.check_margin(margin)
            self._grace = end_on_disconnect
            core.grace_ms(end_on_disconnect)
        self._fence: Optional[int] = None
        self._seq = 0
        self._released = False
        self._ended = False  # as the sync Lock's
        self._release_done = False
        self._lost_at_release = False
        self._used = False

    @property
    def fence(self) -> int:
        """The grant's fencing token: larger than every earlier grant's."""
        if self._fence is None:
            raise errors.RaftlockError(f"{self.name!r} is not held: acquire it first")
        return self._fence

    @property
    def held(self) -> bool:
        """True from the grant until release (even if ``lost``)."""
        return self._fence is not None and not self._released

    @property
    def valid(self) -> bool:
        """True while the lock is held and the client's view of its lease
        holds (computed when read): act on the lock only while it is True.
        False in jeopardy, once ``lost``, before the grant, from
        ``release()`` on, and once a withdrawn upgrade may have ended the
        grant (see the sync ``Lock.valid``)."""
        return (self._fence is not None and not self._released and not self._ended
                and self._session._lease.valid())

    @property
    def lost(self) -> bool:
        """True once the lock is lost: its session ended, or no keep-alive
        was answered within the ttl count. Computed when read; final (see
        the sync ``Lock.lost``)."""
        if self._fence is None:
            return False
        if self._released:
            return self._lost_at_release
        return self._session._lease.is_lost()

    @property
    def session(self) -> "Session":
        if self._session is None:
            raise errors.RaftlockError(f"{self.name!r} is not held: acquire it first")
        return self._session

    async def acquire(self) -> bool:
        """Takes the lock, waiting up to the timeout given (None: without a
        timeout; 0: try once). False if not granted in time (nothing is left
        queued). A Lock is acquired at most once."""
        if self._used:
            raise errors.RaftlockError(f"this Lock of {self.name!r} was acquired before: make a new one")
        self._used = True
        if not self._own:
            return await self._session._acquire_into(self)
        self._session = await self._client._open_session(self._ttl, self._margin, self._grace, 0)
        try:
            ok = await self._session._acquire_into(self)
        except BaseException:
            await self._client._shielded(self._session._close_quietly())
            raise
        if not ok:
            await self._client._shielded(self._session._close_quietly())
        return ok

    @property
    def mode(self) -> str:
        """``"exclusive"``, ``"shared"`` or ``"semaphore"``."""
        return core.MODE_NAMES[self._mode[0]]

    async def upgrade(self, timeout: Optional[float] = None) -> "Lock":
        """As the sync ``Lock.upgrade``: this held shared lock becomes
        exclusive, with a new, larger ``fence``, and is returned; waits up to
        ``timeout`` (None: without one; 0: only at once) for the other
        readers to leave, then ``NotAcquired`` (the read still held);
        ``Deadlock`` at once if another reader is upgrading it. A cancelled
        or unanswered upgrade is withdrawn with ``Cancel`` (which releases
        the lock if it had been granted), and ``valid`` is False for good
        unless the cluster shows the read still held (``CheckFence``): then
        release it and start over."""
        if not self.held:
            raise errors.RaftlockError(f"{self.name!r} is not held: acquire it first")
        if self._ended:
            raise errors.RaftlockError(f"{self.name!r}: its grant ended (an upgrade was withdrawn)")
        if self._mode[0] != core.MODE_SHARED:
            raise errors.InvalidArgument(f"only a shared lock can be upgraded; {self.name!r} is {self.mode}")
        self._fence = await self._session._upgrade(self.name, self._fence, timeout, self._in_doubt)
        self._mode = (core.MODE_EXCLUSIVE, 0, 0)
        return self

    def _in_doubt(self, doubt: bool) -> None:
        self._ended = doubt

    async def downgrade(self) -> "Lock":
        """As the sync ``Lock.downgrade``: this held exclusive lock becomes
        shared at once, keeping its fence, and is returned."""
        if not self.held:
            raise errors.RaftlockError(f"{self.name!r} is not held: acquire it first")
        if self._ended:
            raise errors.RaftlockError(f"{self.name!r}: its grant ended (an upgrade was withdrawn)")
        if self._mode[0] != core.MODE_EXCLUSIVE:
            raise errors.InvalidArgument(f"only an exclusive lock can be downgraded; {self.name!r} is {self.mode}")
        await self._session._downgrade(self.name, self._fence)
        self._mode = (core.MODE_SHARED, 0, 0)
        return self

    async def release(self) -> bool:
        """Releases the grant (and ends the lock's own session). True if
        this call released it. ``held`` is False from the call on, whatever
        the outcome. If it raises (no node answered): for a lock in a
        session of yours, calling it again sends the release again; a lock
        of its own session stopped renewing it at the first call, and its
        lease ends it."""
        if self._fence is None or self._release_done:
            return False
        if not self._released:
            # The holder stops believing as it sends the release, whatever
            # comes back.
            self._released = True
            self._lost_at_release = self._session._lease.is_lost()
        if self._own:
            released = await self._session.close() > 0
        else:
            # Raises if no node answered; a later release() tries again.
            released = await self._session._release(self.name, self._fence)
        self._release_done = True
        return released

    async def __aenter__(self) -> "Lock":
        if not self.held:
            if not await self.acquire():
                raise errors.NotAcquired(self.name, self._timeout)
        return self

    async def __aexit__(self, *exc) -> bool:
        await self.release()
        return False

    def __repr__(self) -> str:
        state = "released" if self._released else ("held" if self._fence is not None else "not acquired")
        return f"<raftlock.aio.Lock {self.name!r} {state} fence={self._fence}>"


class Session:
    """A leased session: any number of grants (one per name), kept alive in
    the background until ``await session.close()``."""

    def __init__(self, client: "Client", session_id: int, lease: core.Lease, grace_ms: int) -> None:
        self._client = client
        self.id = session_id
        self._lease = lease
        self.end_on_disconnect = grace_ms / 1000.0
        self._seqs = itertools.count(1)
        self._closed = False
        self._granted: List[Lock] = []  # for on_lost: the grants handed out, pruned as they go
        if client._on_lost is not None:
            lease.on_lost = self._lost

    def _granted_now(self, locks: Sequence["Lock"]) -> None:
        self._granted = [lk for lk in self._granted if lk.held] + list(locks)

    def _lost(self) -> None:
        """The lease is lost: tells the client's on_lost of each lock
        still held, in the event loop (an awaitable it returns runs as a
        task)."""
        for lk in [lk for lk in self._granted if lk.held]:
            try:
                result = self._client._on_lost(lk.name, lk._fence)
                if inspect.isawaitable(result):
                    self._client._spawn(result)
            except Exception:  # noqa: BLE001 - a callback's failure is its own
                log.exception("on_lost(%r, %d) raised", lk.name, lk._fence)

    @property
    def ttl(self) -> float:
        return self._lease.ttl

    @property
    def valid(self) -> bool:
        """True while the client's view of the lease holds (computed when
        read): False in jeopardy, once lost and once closed."""
        return self._lease.valid()

    @property
    def lost(self) -> bool:
        """True once the lease is lost, for good (computed when read)."""
        return self._lease.is_lost()

    def acquire(self, name: str, shared: bool = False, timeout: Optional[float] = None,
                capacity: Optional[int] = None, weight: int = 1, value: Union[bytes, str, None] = None) -> _Pending:
        """As the sync ``Session.acquire``: ``await`` it for the held
        :class:`Lock` (raising ``NotAcquired`` past ``timeout``), or use it
        with ``async with``."""
        lock = Lock(self._client, name, ttl=None, timeout=timeout, shared=shared, capacity=capacity, weight=weight,
                    value=value, margin=None, end_on_disconnect=None, session=self)

        async def run() -> Lock:
            if not await lock.acquire():
                raise errors.NotAcquired(name, timeout)
            return lock

        return _Pending(run())

    async def acquire_all(self, locks: Sequence[Union[str, dict]], timeout: Optional[float] = None,
                          value: Union[bytes, str, None] = None) -> List[Lock]:
        """As the sync ``Session.acquire_all``: every item of ``locks`` (a
        name, or a dict with ``name`` and ``shared`` or ``capacity`` and
        ``weight``) in one atomic request, all or none; the held locks in
        the order given, or ``NotAcquired`` past ``timeout``."""
        specs = core.lock_specs(locks)
        held = [Lock(self._client, name, ttl=None, timeout=timeout, shared=shared, capacity=capacity, weight=weight,
                     value=value, margin=None, end_on_disconnect=None, session=self)
                for name, shared, capacity, weight in specs]
        if self._closed:
            raise errors.RaftlockError(f"session {self.id} is closed")
        if self._lease.is_lost():
            raise errors.LeaseLost(f"session {self.id} is lost (it ended, or no keep-alive was answered within its ttl)")
        names = [lk.name for lk in held]
        for name in names:
            await self._client._settle(self.id, name)
        timeout_ms, wait = core.timeout_fields(timeout)
        seq = next(self._seqs)
        req = pb.AcquireAllRequest(
            session_id=self.id, seq=seq, timeout_ms=timeout_ms, wait=wait, value=core.check_value(value),
            locks=[pb.LockSpec(name=lk.name, mode=lk._mode[0], weight=lk._mode[1], capacity=lk._mode[2])
                   for lk in held])
        attempt, deadline = _wait_budget(timeout, wait)
        try:
            resp = await self._client._t.call("AcquireAll", req, True, attempt, deadline)
        except _REFUSALS:
            raise
        except BaseException:
            # Queued or granted, maybe: one Cancel naming any of its names
            # withdraws all of it, even if cancelled.
            await self._client._shielded(self._cancel(names[0], seq), [(self.id, n) for n in names])
            raise
        if not resp.acquired:
            raise errors.NotAcquired(", ".join(names), timeout, core.not_all_acquired(names, timeout))
        if len(resp.grants) != len(held):
            raise errors.RaftlockError(f"asked for {len(held)} names, granted {len(resp.grants)}")
        for lk, g in zip(held, resp.grants):
            lk._used = True
            lk._fence, lk._seq = g.fence, seq
        self._granted_now(held)
        if not self._lease.valid():
            # In jeopardy as they were granted: a keep-alive answered now
            # makes the lease held again.
            await self._client._ka.renew_now(self._lease, core.MIN_ASK_WAIT * 5)
        if self._lease.is_lost():
            # Never hand out grants of a lost session.
            for lk in held:
                await self._release(lk.name, lk._fence, quiet=True)
                lk._released = True
            raise errors.LeaseLost(f"session {self.id} was lost before {names!r} were granted")
        return held

    async def _upgrade(self, name: str, fence: int, timeout: Optional[float],
                       in_doubt: Callable[[bool], None] = lambda _d: None) -> int:
        """As the sync ``Session._upgrade``."""
        if self._closed:
            raise errors.RaftlockError(f"session {self.id} is closed")
        await self._client._settle(self.id, name)
        timeout_ms, wait = core.timeout_fields(timeout)
        seq = next(self._seqs)
        req = pb.UpgradeRequest(session_id=self.id, seq=seq, name=name, fence=fence, timeout_ms=timeout_ms,
                                wait=wait)
        attempt, deadline = _wait_budget(timeout, wait)
        try:
            resp = await self._client._t.call("Upgrade", req, True, attempt, deadline)
        except _REFUSALS:
            raise
        except BaseException:
            in_doubt(True)
            await self._client._shielded(self._withdraw_upgrade(name, seq, fence, in_doubt), (self.id, name))
            raise
        if not resp.acquired:
            raise errors.NotAcquired(name, timeout, core.not_upgraded(name, timeout))
        return resp.fence

    async def _downgrade(self, name: str, fence: int) -> None:
        req = pb.DowngradeRequest(session_id=self.id, seq=next(self._seqs), name=name, fence=fence)
        await self._client._t.call("Downgrade", req, True)

    async def _acquire_into(self, lock: Lock) -> bool:
        if self._closed:
            raise errors.RaftlockError(f"session {self.id} is closed")
        if self._lease.is_lost():
            raise errors.LeaseLost(f"session {self.id} is lost (it ended, or no keep-alive was answered within its ttl)")
        # A withdrawal of this name still under way goes first: the cluster
        # refuses a second acquire of a name the session waits for.
        await self._client._settle(self.id, lock.name)
        mode, weight, capacity = lock._mode
        timeout_ms, wait = core.timeout_fields(lock._timeout)
        seq = next(self._seqs)
        req = pb.AcquireRequest(session_id=self.id, seq=seq, name=lock.name, mode=mode, weight=weight,
                                capacity=capacity, timeout_ms=timeout_ms, value=lock._value, wait=wait)
        attempt, deadline = _wait_budget(lock._timeout, wait)
        try:
            resp = await self._client._t.call("Acquire", req, True, attempt, deadline)
        except _REFUSALS:
            raise
        except BaseException:
            # Queued or granted, maybe: withdraw it, even if cancelled.
            await self._client._shielded(self._cancel(lock.name, seq), (self.id, lock.name))
            raise
        if not resp.acquired:
            return False
        lock._fence, lock._seq = resp.fence, seq
        self._granted_now([lock])
        if not self._lease.valid():
            # In jeopardy as it was granted (a pause, a failover while it
            # waited): a keep-alive answered now makes it held again.
            await self._client._ka.renew_now(self._lease, core.MIN_ASK_WAIT * 5)
        if self._lease.is_lost():
            # Never hand out a grant of a lost session (one in jeopardy is
            # handed out: valid again once a keep-alive is answered).
            await self._release(lock.name, resp.fence, quiet=True)
            lock._released = True
            raise errors.LeaseLost(f"session {self.id} was lost before {lock.name!r} was granted")
        return True

    async def _withdraw_upgrade(self, name: str, seq: int, fence: int, in_doubt: Callable[[bool], None]) -> None:
        # As the sync client: only an applied Cancel settles the upgrade,
        # and only the cluster knows whether the read survived.
        if await self._cancel(name, seq):
            try:
                if await self._client.check_fence(name, fence):
                    in_doubt(False)
            except Exception as e:  # noqa: BLE001 - then it stays in doubt
                log.warning("could not learn whether %r is still held after a withdrawn upgrade (%s)", name, e)

    async def _cancel(self, name: str, seq: int) -> bool:
        req = pb.CancelRequest(session_id=self.id, seq=seq, name=name)
        try:
            await self._client._t.call("Cancel", req, True)
        except errors.SessionNotFound:
            pass
        except Exception as e:  # noqa: BLE001 - the session's end withdraws it then
            log.warning("cancelling acquire %d of %r in session %d failed (%s); the session's end withdraws it",
                        seq, name, self.id, e)
            return False
        return True

    async def _release(self, name: str, fence: int, quiet: bool = False) -> bool:
        req = pb.ReleaseRequest(session_id=self.id, seq=next(self._seqs), name=name, fence=fence)
        try:
            return (await self._client._t.call("Release", req, True)).released
        except errors.SessionNotFound:
            return False
        except Exception:
            if quiet:
                return False
            raise

    async def close(self) -> int:
        """Ends the session, releasing everything it holds and withdrawing
        its waits; the number of grants released. Safe to call again (0)."""
        if self._closed:
            return 0
        self._closed = True
        self._client._ka.remove(self.id)
        self._lease.mark_closed()
        req = pb.CloseSessionRequest(session_id=self.id, seq=next(self._seqs))
        try:
            return (await self._client._t.call("CloseSession", req, True)).released
        except errors.SessionNotFound:
            return 0

    async def _close_quietly(self) -> None:
        try:
            await self.close()
        except Exception as e:  # noqa: BLE001 - its lease ends it then
            log.warning("closing session %d failed (%s); its lease ends it", self.id, e)

    async def __aenter__(self) -> "Session":
        return self

    async def __aexit__(self, *exc) -> bool:
        await self.close()
        return False

    def __repr__(self) -> str:
        return f"<raftlock.aio.Session {self.id} ttl={self.ttl}>"


class Client:
    """A handle to a raftlock cluster, for asyncio. Arguments as
    :class:`raftlock.Client`. Nothing is dialled until the first request;
    ``await client.close()`` (or ``async with``) at the end.
    ``on_lost(name, fence)`` is called in the event loop when a lock is
    lost (not in jeopardy; see the sync ``Lock.valid``); it must not
    block, and a coroutine function's coroutine runs as a task."""

    def __init__(self, endpoints: Union[str, Sequence[str]], token: Optional[str] = None, ca=None, cert=None,
                 key=None, on_lost: Optional[Callable[[str, int], object]] = None) -> None:
        self._on_lost = core.check_on_lost(on_lost)
        self._t = _Transport(endpoints, token, ca, cert, key)
        self._ka = _KeepAlive(self._t)
        self._background: Set[asyncio.Task] = set()
        self._withdrawing = {}

    def _spawn(self, awaitable) -> None:
        """Runs ``awaitable`` as a task of this client's (kept until done)."""
        task = asyncio.ensure_future(awaitable)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(lambda t: t.cancelled() or t.exception() is None
                               or log.error("on_lost raised", exc_info=t.exception()))

    @property
    def endpoints(self) -> Tuple[str, ...]:
        return tuple(self._t.endpoints.all)

    async def _shielded(self, coro, key=None) -> None:
        """Runs ``coro`` to its end even if the caller is cancelled meanwhile
        (it then goes on in the background)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        # One key (session, name), or a list of them (an atomic request's).
        for k in [] if key is None else key if isinstance(key, list) else [key]:
            self._withdrawing[k] = task
            task.add_done_callback(lambda _t, k=k: self._withdrawing.pop(k, None))
        try:
            await asyncio.shield(task)
        except BaseException:  # noqa: BLE001 - cancelled again: it goes on alone
            pass

    async def _settle(self, session_id: int, name: str) -> None:
        task = self._withdrawing.get((session_id, name))
        if task is not None:
            await asyncio.shield(task)

    def lock(self, name: str, ttl: float = core.DEFAULT_TTL, timeout: Optional[float] = None, shared: bool = False,
             *, capacity: Optional[int] = None, weight: int = 1, value: Union[bytes, str, None] = None,
             end_on_disconnect: Optional[float] = core.DEFAULT_END_ON_DISCONNECT,
             margin: float = core.DEFAULT_MARGIN) -> Lock:
        """As :meth:`raftlock.Client.lock`: ``async with client.lock(...)
        as lock`` or ``await lock.acquire()``."""
        return Lock(self, name, ttl=ttl, timeout=timeout, shared=shared, capacity=capacity, weight=weight,
                    value=value, margin=margin, end_on_disconnect=end_on_disconnect)

    def session(self, ttl: float = core.DEFAULT_TTL, *,
                end_on_disconnect: Optional[float] = core.DEFAULT_END_ON_DISCONNECT,
                margin: float = core.DEFAULT_MARGIN, lock_delay: float = 0.0) -> _Pending:
        """As :meth:`raftlock.Client.session`: ``await`` it, or ``async
        with client.session() as session`` (closed at the end)."""
        core.ttl_ms(ttl)
        core.grace_ms(end_on_disconnect)
        margin = core.check_margin(margin)
        return _Pending(self._open_session(ttl, margin, end_on_disconnect, lock_delay))

    async def _open_session(self, ttl, margin, grace, lock_delay) -> Session:
        delay = core.seconds("lock_delay", lock_delay)
        if delay < 0:
            raise errors.InvalidArgument(f"lock_delay must be >= 0, got {lock_delay!r}")
        grace_ms = core.grace_ms(grace)
        req = pb.OpenSessionRequest(ttl_ms=core.ttl_ms(ttl), lock_delay_ms=round(delay * 1000),
                                    nonce=random.getrandbits(64) | 1, end_on_disconnect_ms=grace_ms)
        sent_at = core.now()
        resp = await self._t.call("OpenSession", req, True)
        lease = core.Lease(resp.session_id, resp.ttl_ms / 1000.0, margin, sent_at, grace_ms / 1000.0, core.now())
        session = Session(self, resp.session_id, lease, grace_ms)
        if grace_ms:
            # Renewed on the stream at once: the view (from the open's send)
            # lasts only a grace.
            self._ka.add(lease, core.now())
            try:
                await self._ka.renew_now(lease, max(lease.ttl / 3, core.MIN_ASK_WAIT))
            except BaseException:
                await self._shielded(session._close_quietly())
                raise
        else:
            self._ka.add(lease, sent_at + lease.ttl / 3)
        if not lease.activate():
            await session._close_quietly()
            raise errors.LeaseLost(f"session {resp.session_id} was lost as it opened")
        return session

    async def describe(self, name: str) -> Optional[core.LockInfo]:
        """The holders and waiters of ``name`` (linearizable); None if nobody
        holds, waits for or delays it."""
        resp = await self._t.call("Describe", pb.DescribeRequest(name=core.check_name(name)), False)
        return core.lock_info(resp.info) if resp.exists else None

    async def leader(self, name: str) -> Optional[Tuple[bytes, int]]:
        """Leader election: ``(value, fence)`` of the holder of ``name``."""
        info = await self.describe(name)
        if info is None or not info.holders:
            return None
        h = info.holders[0]
        return h.value, h.fence

    async def check_fence(self, name: str, fence: int) -> bool:
        """True if ``fence`` belongs to a current holder of ``name``."""
        req = pb.CheckFenceRequest(name=core.check_name(name), fence=fence)
        return (await self._t.call("CheckFence", req, False)).current

    async def close(self) -> None:
        """Waits for withdrawals under way, stops the keep-alives and closes
        the connections."""
        if self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)
        await self._ka.close()
        await self._t.close()

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc) -> bool:
        await self.close()
        return False
