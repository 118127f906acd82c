"""The synchronous client (``raftlock.Client``): blocking calls on gRPC's
sync API, and one background thread per client that keeps every session
alive on one ``KeepAlive`` stream. The rules it follows are in ``_core``."""

from __future__ import annotations

import itertools
import logging
import queue
import random
import threading
import time
from typing import Callable, List, Optional, Sequence, Tuple, Union

import grpc

from . import _core as core
from . import errors
from .v1 import locks_pb2 as pb
from .v1 import locks_pb2_grpc as pbg

log = logging.getLogger("raftlock")

_DEFAULT = object()
#: Errors that are the cluster's definite refusal: nothing was queued.
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
        self._lock = threading.Lock()
        self.closed = False

    def stub(self, addr: str) -> pbg.LocksStub:
        with self._lock:
            if self.closed:
                raise errors.RaftlockError("the client is closed")
            got = self._channels.get(addr)
            if got is None:
                if self.credentials is not None:
                    ch = grpc.secure_channel(addr, self.credentials, options=core.CHANNEL_OPTIONS)
                else:
                    ch = grpc.insecure_channel(addr, options=core.CHANNEL_OPTIONS)
                got = (ch, pbg.LocksStub(ch))
                self._channels[addr] = got
            return got[1]

    def call(self, method: str, request, write: bool, attempt=core.REQUEST_TIMEOUT, deadline=None):
        """``method`` at the leader, retried by the rules of ``core.Attempts``."""
        if deadline is None:
            deadline = core.deadline_after(core.RETRY_DEADLINE)
        attempts = core.Attempts(self.endpoints, write, deadline)
        while True:
            budget = attempts.budget(attempt)
            addr = self.endpoints.target()
            fut = getattr(self.stub(addr), method).future(request, timeout=budget, metadata=self.metadata)
            try:
                resp = fut.result()
            except grpc.RpcError as e:
                pause = attempts.failed(addr, e)
            except BaseException:
                # Interrupted (KeyboardInterrupt, say): stop the call; the
                # caller withdraws what it may have started.
                fut.cancel()
                raise
            else:
                try:
                    md = fut.initial_metadata()
                except Exception:  # noqa: BLE001 - metadata is a hint only
                    md = None
                attempts.succeeded(addr, md)
                return resp
            if pause:
                time.sleep(pause)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            channels, self._channels = self._channels, {}
        for ch, _ in channels.values():
            ch.close()


class _Stream:
    """One open KeepAlive stream."""

    def __init__(self, addr: str, call, requests: "queue.SimpleQueue") -> None:
        self.addr = addr
        self.call = call
        self.requests = requests

    def send(self, ask: core.Ask) -> None:
        self.requests.put(pb.KeepAliveRequest(session_id=ask.session_id, ask_id=ask.ask_id))

    def end(self) -> None:
        """Half-closes the stream (the request iterator ends)."""
        self.requests.put(None)


def _requests(q: "queue.SimpleQueue"):
    while True:
        item = q.get()
        if item is None:
            return
        yield item


class _KeepAlive:
    """Every session of a client, kept alive on one stream by one thread."""

    def __init__(self, transport: _Transport) -> None:
        self.t = transport
        self.cond = threading.Condition()
        self.r = core.Renewals()
        self.stream: Optional[_Stream] = None
        #: A stalled stream left open until the next one has renewed every
        #: session that ends with its stream (closing it first would start
        #: their grace on the leader with no stream renewing them).
        self.old: Optional[_Stream] = None
        self.retry_at = 0.0
        self.backoff = core.INITIAL_BACKOFF
        self.hops = 0
        self.thread: Optional[threading.Thread] = None
        self.closed = False

    def add(self, lease: core.Lease, first: float) -> None:
        with self.cond:
            self.r.add(lease, first)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="raftlock-keepalive", daemon=True)
                self.thread.start()
            self.cond.notify_all()

    def remove(self, session_id: int) -> None:
        with self.cond:
            self.r.remove(session_id)
            self.cond.notify_all()

    def renew_now(self, lease: core.Lease, timeout: float) -> bool:
        """Renews ``lease`` at once; True once the answer came (a lost or
        expired session, or no answer within ``timeout``: False)."""
        deadline = core.now() + timeout
        sid = lease.session_id
        with self.cond:
            if sid not in self.r.entries:
                return False
            before = self.r.renew_now(sid, core.now())
            self.cond.notify_all()
            while True:
                e = self.r.entries.get(sid)
                if e is None:
                    return False
                if e.answers > before:
                    return True
                left = deadline - core.now()
                if left <= 0:
                    return False
                self.cond.wait(left)

    def close(self) -> None:
        with self.cond:
            self.closed = True
            if self.stream is not None:
                self._drop(self.stream)
            self._close_old()
            self.cond.notify_all()

    def _run(self) -> None:
        with self.cond:
            while not self.closed:
                t = core.now()
                self.r.prune(t)
                if self.stream is not None and self.r.overdue(t):
                    # Nothing came back since an ask was sent: the leader
                    # may be gone with the connection still up, or slow.
                    # Try another stream; this one stays open until that
                    # one has renewed the sessions.
                    self.t.endpoints.forget(self.stream.addr)
                    self._leave(self.stream)
                for lease in self.r.take_lost(t):
                    if lease.on_lost is not None:
                        threading.Thread(target=lease.on_lost, name="raftlock-on-lost", daemon=True).start()
                if not self.r.entries:
                    if self.stream is not None:
                        # No session left: end the stream politely.
                        st, self.stream = self.stream, None
                        st.end()
                    self.cond.wait()
                    continue
                if self.stream is None and t >= self.retry_at:
                    self._open()
                if self.stream is not None:
                    for ask in self.r.due(t):
                        self.stream.send(ask)
                wake = self.r.next_wakeup(t)
                if self.stream is None:
                    wake = self.retry_at if wake is None else min(wake, self.retry_at)
                self.cond.wait(None if wake is None else max(0.0, wake - core.now()))

    def _open(self) -> None:
        addr = self.t.endpoints.target()
        requests: "queue.SimpleQueue" = queue.SimpleQueue()
        try:
            call = self.t.stub(addr).KeepAlive(_requests(requests), metadata=self.t.metadata)
        except errors.RaftlockError:
            self.closed = True
            return
        st = _Stream(addr, call, requests)
        self.stream = st
        self.r.stream_opened(core.now())
        threading.Thread(target=self._read, args=(st,), name="raftlock-keepalive-read", daemon=True).start()

    def _drop(self, st: _Stream) -> None:
        """Abandons stream ``st`` (its asks are retried on the next)."""
        if self.stream is st:
            self.stream = None
        st.end()
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
            st.end()
            st.call.cancel()
        self.r.stream_failed(core.now())
        self.retry_at = core.now() + self.backoff * random.uniform(0.5, 1.5)
        self.backoff = min(self.backoff * 2, core.MAX_BACKOFF)

    def _close_old(self) -> None:
        if self.old is not None:
            old, self.old = self.old, None
            old.end()
            old.call.cancel()

    def _read(self, st: _Stream) -> None:
        err = None
        try:
            for resp in st.call:
                with self.cond:
                    if st is self.old:
                        continue  # left for a newer stream: open, not credited
                    if self.stream is not st:
                        break
                    self.r.answer(resp.session_id, resp.ask_id, resp.ttl_ms, resp.expired, core.now())
                    if self.r.all_bound():
                        self._close_old()
                    self.backoff = core.INITIAL_BACKOFF
                    self.hops = 0
                    self.cond.notify_all()
        except grpc.RpcError as e:
            err = e
        with self.cond:
            if self.old is st:
                self.old = None  # the left stream ended by itself
                return
            if self.stream is not st:
                return  # dropped or ended on purpose
            self.stream = None
            st.end()
            md = core.status_of(err)[2] if err is not None else {}
            self.r.stream_failed(core.now())
            hint = md.get(core.LEADER_KEY)
            if hint and hint != st.addr and self.hops < 3:
                # Not the leader, and it named the leader: go there at once.
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
            self.cond.notify_all()


def _wait_budget(timeout: Optional[float], wait: bool) -> Tuple[float, float]:
    """``(attempt, deadline)`` of a request that may wait ``timeout``."""
    if wait:
        return core.FOREVER_ATTEMPT, float("inf")
    t = float(timeout)
    return core.REQUEST_TIMEOUT + 2 * t, core.deadline_after(core.RETRY_DEADLINE + 2 * t)


class Lock:
    """A lock or semaphore permits: either a lock with a session of its own
    (from :meth:`Client.lock`, taken by :meth:`acquire` or ``with``), or a
    grant in a session (from :meth:`Session.acquire`, already held).

    ``fence`` is the grant's fencing token (pass it to every store you
    write); ``valid`` says, when read, whether the lock is held by the
    client's count (act on it only then); ``lost`` whether it is lost, for
    good; ``release()`` is safe to call any number of times. Leaving a
    ``with`` block releases it."""

    def __init__(self, client, name, *, ttl, timeout, shared, capacity, weight, value, margin, end_on_disconnect,
                 session=None) -> None:
        self.name = core.check_name(name)
        self._client = client
        self._timeout = timeout
        core.timeout_fields(timeout)  # checked now: bad input raises here
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
        # The grant may have ended without a release: an upgrade withdrawn
        # with Cancel, unless the cluster showed the read still held.
        self._ended = False
        self._release_done = False
        self._lost_at_release = False
        self._used = False
        self._mutex = threading.Lock()

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
        False in jeopardy (no keep-alive answered within the grace count:
        the stream may have closed and the session ended a grace later; it
        turns True again when a keep-alive is answered, which proves the
        session and its grants alive), once ``lost``, before the grant,
        from ``release()`` on, and for good once an upgrade withdrawn with
        ``Cancel`` may have ended the grant (see ``upgrade``)."""
        return (self._fence is not None and not self._released and not self._ended
                and self._session._lease.valid())

    @property
    def lost(self) -> bool:
        """True once the lock is lost: the cluster said its session ended
        (expired, revoked), or no keep-alive was answered within the ttl
        count (the send of the last one answered + the ttl, less the
        margin). Computed when read; final, never False again. False in
        jeopardy (see ``valid``). After ``release()``, what it was then;
        False for a lock never acquired."""
        if self._fence is None:
            return False
        if self._released:
            return self._lost_at_release
        return self._session._lease.is_lost()

    @property
    def session(self) -> "Session":
        """The session holding the lock."""
        if self._session is None:
            raise errors.RaftlockError(f"{self.name!r} is not held: acquire it first")
        return self._session

    def acquire(self) -> bool:
        """Takes the lock, waiting up to the timeout given (None: without a
        timeout; 0: try once). False if not granted in time (nothing is left
        queued). A Lock is acquired at most once."""
        with self._mutex:
            if self._used:
                raise errors.RaftlockError(f"this Lock of {self.name!r} was acquired before: make a new one")
            self._used = True
        if not self._own:
            return self._session._acquire_into(self)
        self._session = self._client._open_session(self._ttl, self._margin, self._grace, 0)
        try:
            ok = self._session._acquire_into(self)
        except BaseException:
            self._session._close_quietly()
            raise
        if not ok:
            self._session._close_quietly()
        return ok

    @property
    def mode(self) -> str:
        """``"exclusive"``, ``"shared"`` or ``"semaphore"``."""
        return core.MODE_NAMES[self._mode[0]]

    def upgrade(self, timeout: Optional[float] = None) -> "Lock":
        """Turns this held shared lock into an exclusive one, with no window
        in which another writer gets in, and returns it (this same object,
        now exclusive, with a new, larger ``fence``: hand that one to your
        stores). Granted at once if this is the lock's only reader;
        otherwise it waits, ahead of everyone queued, keeping its read,
        until the other readers leave: up to ``timeout`` seconds (None:
        without a timeout; 0: only if it can be granted at once), then
        raises :class:`raftlock.NotAcquired`, the read still held. Another
        reader upgrading the same lock at the same time makes this raise
        :class:`raftlock.Deadlock` at once (the two would wait for each
        other forever), the read still held: release it and take the lock
        again. If the call fails any other way than by the cluster's
        refusal (``OutcomeUnknown``, ``Unavailable``, an interrupt), the
        upgrade is withdrawn with ``Cancel`` first, which also releases the
        lock if the upgrade had been granted; the client then asks the
        cluster (``CheckFence``) whether the read is still held. If not, or
        if that cannot be learnt, the grant has ended: ``valid`` is False
        for good and a later upgrade or downgrade raises (release it and
        start over); if so, the lock goes on holding the read."""
        with self._mutex:
            if not self.held:
                raise errors.RaftlockError(f"{self.name!r} is not held: acquire it first")
            if self._ended:
                raise errors.RaftlockError(f"{self.name!r}: its grant ended (an upgrade was withdrawn)")
            if self._mode[0] != core.MODE_SHARED:
                raise errors.InvalidArgument(f"only a shared lock can be upgraded; {self.name!r} is {self.mode}")
            fence = self._fence
        new = self._session._upgrade(self.name, fence, timeout, self._in_doubt)
        with self._mutex:
            self._fence, self._mode = new, (core.MODE_EXCLUSIVE, 0, 0)
        return self

    def _in_doubt(self, doubt: bool) -> None:
        self._ended = doubt

    def downgrade(self) -> "Lock":
        """Turns this held exclusive lock into a shared one, at once, and
        returns it (this same object, now shared). The fence stays the same
        (the grant only weakens); readers queued behind it come in."""
        with self._mutex:
            if not self.held:
                raise errors.RaftlockError(f"{self.name!r} is not held: acquire it first")
            if self._ended:
                raise errors.RaftlockError(f"{self.name!r}: its grant ended (an upgrade was withdrawn)")
            if self._mode[0] != core.MODE_EXCLUSIVE:
                raise errors.InvalidArgument(f"only an exclusive lock can be downgraded; {self.name!r} is {self.mode}")
            fence = self._fence
        self._session._downgrade(self.name, fence)
        with self._mutex:
            self._mode = (core.MODE_SHARED, 0, 0)
        return self

    def release(self) -> bool:
        """Releases the grant (and ends the lock's own session). True if
        this call released it; False if it was released before, or was no
        longer held (its session expired). ``held`` is False from the call
        on, whatever the outcome. If it raises (no node answered): for a
        lock in a session of yours, calling it again sends the release
        again; a lock of its own session (``client.lock``) stopped renewing
        that session at the first call, and its lease ends it."""
        with self._mutex:
            if self._fence is None or self._release_done:
                return False
            if not self._released:
                # The holder stops believing as it sends the release,
                # whatever comes back.
                self._released = True
                self._lost_at_release = self._session._lease.is_lost()
        if self._own:
            released = self._session.close() > 0
        else:
            # Raises if no node answered; a later release() tries again.
            released = self._session._release(self.name, self._fence)
        self._release_done = True
        return released

    def __enter__(self) -> "Lock":
        if not self.held:
            if not self.acquire():
                raise errors.NotAcquired(self.name, self._timeout)
        return self

    def __exit__(self, *exc) -> bool:
        self.release()
        return False

    def __repr__(self) -> str:
        state = "released" if self._released else ("held" if self._fence is not None else "not acquired")
        return f"<raftlock.Lock {self.name!r} {state} fence={self._fence}>"


class Session:
    """A leased session: any number of grants (one per name), kept alive in
    the background until :meth:`close`. Leaving a ``with`` block closes it
    (releasing everything it holds)."""

    def __init__(self, client: "Client", session_id: int, lease: core.Lease, grace_ms: int) -> None:
        self._client = client
        self.id = session_id
        self._lease = lease
        self.end_on_disconnect = grace_ms / 1000.0
        self._seqs = itertools.count(1)
        self._closed = False
        self._mutex = threading.Lock()
        self._granted: List[Lock] = []  # for on_lost: the grants handed out, pruned as they go
        if client._on_lost is not None:
            lease.on_lost = self._lost

    def _granted_now(self, locks: Sequence[Lock]) -> None:
        with self._mutex:
            self._granted = [lk for lk in self._granted if lk.held] + list(locks)

    def _lost(self) -> None:
        """The lease is lost: tells the client's on_lost of each lock
        still held (in a thread of its own)."""
        with self._mutex:
            held = [(lk.name, lk._fence) for lk in self._granted if lk.held]
        for name, fence in held:
            try:
                self._client._on_lost(name, fence)
            except Exception:  # noqa: BLE001 - a callback's failure is its own
                log.exception("on_lost(%r, %d) raised", name, fence)

    @property
    def ttl(self) -> float:
        """The lease length in seconds."""
        return self._lease.ttl

    @property
    def valid(self) -> bool:
        """True while the client's view of the lease holds (computed when
        read): False in jeopardy, once lost and once closed (see
        ``Lock.valid``)."""
        return self._lease.valid()

    @property
    def lost(self) -> bool:
        """True once the lease is lost, for good (computed when read; see
        ``Lock.lost``)."""
        return self._lease.is_lost()

    def acquire(self, name: str, shared: bool = False, timeout: Optional[float] = None,
                capacity: Optional[int] = None, weight: int = 1, value: Union[bytes, str, None] = None) -> Lock:
        """Takes ``name`` in this session: an exclusive lock, a shared one
        (``shared=True``), or ``weight`` permits of a semaphore of
        ``capacity``. Waits up to ``timeout`` seconds (None: without a
        timeout; 0: try once) and raises :class:`raftlock.NotAcquired` if
        not granted by then. ``value`` is shown to readers while held."""
        lock = Lock(self._client, name, ttl=None, timeout=timeout, shared=shared, capacity=capacity, weight=weight,
                    value=value, margin=None, end_on_disconnect=None, session=self)
        if not lock.acquire():
            raise errors.NotAcquired(name, timeout)
        return lock

    def acquire_all(self, locks: Sequence[Union[str, dict]], timeout: Optional[float] = None,
                    value: Union[bytes, str, None] = None) -> List[Lock]:
        """Takes every item of ``locks`` in one atomic request (the
        ``AcquireAll`` RPC, one write): all are granted together, each with
        its own fence, or none is. An item is a name (an exclusive lock) or
        a dict with ``name`` and, as :meth:`acquire` takes them,
        ``shared=True`` or ``capacity`` and ``weight``; 1..=64 items, each
        name once. If they cannot all be granted now the request waits in
        every name's queue at once, up to ``timeout`` seconds (None: without
        a timeout; 0: try once), and is granted when it is first in line
        for all of them; then :class:`raftlock.NotAcquired`, nothing held
        or queued. Two such requests never wait for each other, whatever
        order they name things in. :class:`raftlock.Deadlock` if this
        session holds something that a waiter for one of these names needs.
        Returns the held locks in the order of ``locks``."""
        specs = core.lock_specs(locks)
        held = [Lock(self._client, name, ttl=None, timeout=timeout, shared=shared, capacity=capacity, weight=weight,
                     value=value, margin=None, end_on_disconnect=None, session=self)
                for name, shared, capacity, weight in specs]
        if self._closed:
            raise errors.RaftlockError(f"session {self.id} is closed")
        if self._lease.is_lost():
            raise errors.LeaseLost(f"session {self.id} is lost (it ended, or no keep-alive was answered within its ttl)")
        timeout_ms, wait = core.timeout_fields(timeout)
        seq = next(self._seqs)
        req = pb.AcquireAllRequest(
            session_id=self.id, seq=seq, timeout_ms=timeout_ms, wait=wait, value=core.check_value(value),
            locks=[pb.LockSpec(name=lk.name, mode=lk._mode[0], weight=lk._mode[1], capacity=lk._mode[2])
                   for lk in held])
        attempt, deadline = _wait_budget(timeout, wait)
        try:
            resp = self._client._t.call("AcquireAll", req, True, attempt, deadline)
        except _REFUSALS:
            raise
        except BaseException:
            # Queued or granted, maybe: one Cancel naming any of its names
            # withdraws all of it.
            self._cancel(held[0].name, seq)
            raise
        names = [lk.name for lk in held]
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
            self._client._ka.renew_now(self._lease, core.MIN_ASK_WAIT * 5)
        if self._lease.is_lost():
            # Never hand out grants of a lost session.
            for lk in held:
                self._release(lk.name, lk._fence, quiet=True)
                lk._released = True
            raise errors.LeaseLost(f"session {self.id} was lost before {names!r} were granted")
        return held

    def _upgrade(self, name: str, fence: int, timeout: Optional[float],
                 in_doubt: Callable[[bool], None] = lambda _d: None) -> int:
        """The exclusive grant's fence; raises NotAcquired past the timeout.
        An upgrade whose outcome is unknown is withdrawn; ``in_doubt(True)``
        is called first, and ``in_doubt(False)`` once the cluster shows the
        read (``fence``) still held."""
        if self._closed:
            raise errors.RaftlockError(f"session {self.id} is closed")
        timeout_ms, wait = core.timeout_fields(timeout)
        seq = next(self._seqs)
        req = pb.UpgradeRequest(session_id=self.id, seq=seq, name=name, fence=fence, timeout_ms=timeout_ms,
                                wait=wait)
        attempt, deadline = _wait_budget(timeout, wait)
        try:
            resp = self._client._t.call("Upgrade", req, True, attempt, deadline)
        except _REFUSALS:
            raise
        except BaseException:
            # Waiting or granted, maybe: withdraw it (a granted upgrade is
            # released, the read with it). Only a Cancel that was applied
            # settles it (one still on its way could be granted later), and
            # only the cluster knows whether the read survived.
            in_doubt(True)
            if self._cancel(name, seq):
                try:
                    if self._client.check_fence(name, fence):
                        in_doubt(False)
                except Exception as e:  # noqa: BLE001 - then it stays in doubt
                    log.warning("could not learn whether %r is still held after a withdrawn upgrade (%s)", name, e)
            raise
        if not resp.acquired:
            raise errors.NotAcquired(name, timeout, core.not_upgraded(name, timeout))
        return resp.fence

    def _downgrade(self, name: str, fence: int) -> None:
        req = pb.DowngradeRequest(session_id=self.id, seq=next(self._seqs), name=name, fence=fence)
        self._client._t.call("Downgrade", req, True)

    def _acquire_into(self, lock: Lock) -> bool:
        if self._closed:
            raise errors.RaftlockError(f"session {self.id} is closed")
        if self._lease.is_lost():
            raise errors.LeaseLost(f"session {self.id} is lost (it ended, or no keep-alive was answered within its ttl)")
        mode, weight, capacity = lock._mode
        timeout_ms, wait = core.timeout_fields(lock._timeout)
        seq = next(self._seqs)
        req = pb.AcquireRequest(session_id=self.id, seq=seq, name=lock.name, mode=mode, weight=weight,
                                capacity=capacity, timeout_ms=timeout_ms, value=lock._value, wait=wait)
        attempt, deadline = _wait_budget(lock._timeout, wait)
        try:
            resp = self._client._t.call("Acquire", req, True, attempt, deadline)
        except _REFUSALS:
            raise
        except BaseException:
            # The acquire may be queued or granted: withdraw it.
            self._cancel(lock.name, seq)
            raise
        if not resp.acquired:
            return False
        lock._fence, lock._seq = resp.fence, seq
        self._granted_now([lock])
        if not self._lease.valid():
            # In jeopardy as it was granted (a pause, a failover while it
            # waited): a keep-alive answered now makes it held again.
            self._client._ka.renew_now(self._lease, core.MIN_ASK_WAIT * 5)
        if self._lease.is_lost():
            # Never hand out a grant of a lost session (one in jeopardy is
            # handed out: valid again once a keep-alive is answered).
            self._release(lock.name, resp.fence, quiet=True)
            lock._released = True
            raise errors.LeaseLost(f"session {self.id} was lost before {lock.name!r} was granted")
        return True

    def _cancel(self, name: str, seq: int) -> bool:
        """Withdraws the request ``seq``; False if the Cancel could not be
        sent (then the session's end withdraws it)."""
        req = pb.CancelRequest(session_id=self.id, seq=seq, name=name)
        try:
            self._client._t.call("Cancel", req, True)
        except errors.SessionNotFound:
            pass  # the session's end withdrew it
        except Exception as e:  # noqa: BLE001 - the session's end withdraws it then
            log.warning("cancelling acquire %d of %r in session %d failed (%s); the session's end withdraws it",
                        seq, name, self.id, e)
            return False
        return True

    def _release(self, name: str, fence: int, quiet: bool = False) -> bool:
        req = pb.ReleaseRequest(session_id=self.id, seq=next(self._seqs), name=name, fence=fence)
        try:
            return self._client._t.call("Release", req, True).released
        except errors.SessionNotFound:
            return False
        except Exception:
            if quiet:
                return False
            raise

    def close(self) -> int:
        """Ends the session, releasing everything it holds and withdrawing
        its waits; the number of grants released. Safe to call again (0)."""
        with self._mutex:
            if self._closed:
                return 0
            self._closed = True
        self._client._ka.remove(self.id)
        self._lease.mark_closed()
        req = pb.CloseSessionRequest(session_id=self.id, seq=next(self._seqs))
        try:
            return self._client._t.call("CloseSession", req, True).released
        except errors.SessionNotFound:
            return 0

    def _close_quietly(self) -> None:
        try:
            self.close()
        except Exception as e:  # noqa: BLE001 - its lease ends it then
            log.warning("closing session %d failed (%s); its lease ends it", self.id, e)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

    def __repr__(self) -> str:
        return f"<raftlock.Session {self.id} ttl={self.ttl}>"


class Client:
    """A handle to a raftlock cluster.

    ``endpoints`` is a list of ``host:port`` (any nodes of the cluster) or
    one comma-separated string. ``token`` is sent as ``authorization:
    Bearer TOKEN``. ``ca`` turns TLS on (the CA that signed the nodes'
    certificates); ``cert`` and ``key`` add a client certificate (mTLS).
    Each of the three is a path, PEM text or PEM bytes. Nothing is dialled
    until the first request. Thread-safe; one client per process is
    enough (all its sessions share one keep-alive stream).

    ``on_lost(name, fence)``, if given, is called once for each lock held
    when it is lost (the moment ``lock.lost`` turns True: not in jeopardy,
    see ``Lock.valid``), in a thread of its own; nothing is cancelled. An
    exception it raises is logged."""

    def __init__(self, endpoints: Union[str, Sequence[str]], token: Optional[str] = None, ca=None, cert=None,
                 key=None, on_lost: Optional[Callable[[str, int], object]] = None) -> None:
        self._on_lost = core.check_on_lost(on_lost)
        self._t = _Transport(endpoints, token, ca, cert, key)
        self._ka = _KeepAlive(self._t)

    @property
    def endpoints(self) -> Tuple[str, ...]:
        return tuple(self._t.endpoints.all)

    def lock(self, name: str, ttl: float = core.DEFAULT_TTL, timeout: Optional[float] = None, shared: bool = False,
             *, capacity: Optional[int] = None, weight: int = 1, value: Union[bytes, str, None] = None,
             end_on_disconnect: Optional[float] = core.DEFAULT_END_ON_DISCONNECT,
             margin: float = core.DEFAULT_MARGIN) -> Lock:
        """A lock on ``name`` with a session of its own (``ttl`` seconds,
        kept alive in the background), taken by ``with`` (raising
        :class:`raftlock.NotAcquired` if not granted within ``timeout``
        seconds; None waits without a timeout, 0 tries once) or by
        :meth:`Lock.acquire` (returning False instead). If this process
        dies, its session ends ``end_on_disconnect`` seconds after its
        keep-alive stream closes (None or 0: at the end of the ttl)."""
        return Lock(self, name, ttl=ttl, timeout=timeout, shared=shared, capacity=capacity, weight=weight,
                    value=value, margin=margin, end_on_disconnect=end_on_disconnect)

    def session(self, ttl: float = core.DEFAULT_TTL, *,
                end_on_disconnect: Optional[float] = core.DEFAULT_END_ON_DISCONNECT,
                margin: float = core.DEFAULT_MARGIN, lock_delay: float = 0.0) -> Session:
        """Opens a session of ``ttl`` seconds, kept alive in the background
        until closed. ``end_on_disconnect`` as for :meth:`lock`;
        ``lock_delay`` keeps its locks unavailable that long after it
        expires."""
        core.ttl_ms(ttl)
        core.grace_ms(end_on_disconnect)
        return self._open_session(ttl, core.check_margin(margin), end_on_disconnect, lock_delay)

    def _open_session(self, ttl, margin, grace, lock_delay) -> Session:
        delay = core.seconds("lock_delay", lock_delay)
        if delay < 0:
            raise errors.InvalidArgument(f"lock_delay must be >= 0, got {lock_delay!r}")
        grace_ms = core.grace_ms(grace)
        req = pb.OpenSessionRequest(ttl_ms=core.ttl_ms(ttl), lock_delay_ms=round(delay * 1000),
                                    nonce=random.getrandbits(64) | 1, end_on_disconnect_ms=grace_ms)
        sent_at = core.now()
        resp = self._t.call("OpenSession", req, True)
        lease = core.Lease(resp.session_id, resp.ttl_ms / 1000.0, margin, sent_at, grace_ms / 1000.0, core.now())
        session = Session(self, resp.session_id, lease, grace_ms)
        if grace_ms:
            # Renewed on the stream at once: the view (from the open's send)
            # lasts only a grace.
            self._ka.add(lease, core.now())
            self._ka.renew_now(lease, max(lease.ttl / 3, core.MIN_ASK_WAIT))
        else:
            self._ka.add(lease, sent_at + lease.ttl / 3)
        if not lease.activate():
            session._close_quietly()
            raise errors.LeaseLost(f"session {resp.session_id} was lost as it opened")
        return session

    def describe(self, name: str) -> Optional[core.LockInfo]:
        """The holders and waiters of ``name`` (linearizable); None if nobody
        holds, waits for or delays it."""
        resp = self._t.call("Describe", pb.DescribeRequest(name=core.check_name(name)), False)
        return core.lock_info(resp.info) if resp.exists else None

    def leader(self, name: str) -> Optional[Tuple[bytes, int]]:
        """Leader election: the ``(value, fence)`` of the exclusive holder of
        ``name`` (a candidate campaigns with ``client.lock(name,
        value=...)``); None while nobody leads."""
        info = self.describe(name)
        if info is None or not info.holders:
            return None
        h = info.holders[0]
        return h.value, h.fence

    def check_fence(self, name: str, fence: int) -> bool:
        """True if ``fence`` belongs to a current holder of ``name``
        (linearizable: Chubby's CheckSequencer)."""
        req = pb.CheckFenceRequest(name=core.check_name(name), fence=fence)
        return self._t.call("CheckFence", req, False).current

    def close(self) -> None:
        """Stops the keep-alives and closes the connections. Sessions not
        closed before end with the stream (after their grace) or their
        ttl."""
        self._ka.close()
        self._t.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False
