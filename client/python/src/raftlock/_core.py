"""What the sync and the asyncio clients share: limits, argument checks,
the lease view, the keep-alive schedule and the retry policy. Nothing here
does I/O or sleeps: the drivers (``_sync.py``, ``aio.py``) do, and ask
this module what to do next, so both follow the same rules:

* **Lease view.** A session believes its lease only until the *send* time
  of the last keep-alive the leader acknowledged, plus the ttl, minus a
  margin (10 % of the ttl by default). The leader counts from when it
  processed that keep-alive (later), and a new leader restarts every lease
  at full length, so the client's view ends first. Each keep-alive carries
  its own ``ask_id``, and an answer is credited only to the ask whose id it
  echoes, from that ask's send time, and only if it came while the ask
  still waited (``ask_wait``). A session that ends with its stream
  (``end_on_disconnect``) is also believed only a grace (less the margin)
  past the send time of its open or of the last ask its stream answered
  (see ``Lease``). Past that grace count but within the ttl count (from
  when the last answer *came*) the lease is in *jeopardy*: not valid, not
  lost, still renewed, and valid again once a keep-alive is answered. It
  is lost, for good, only when the cluster says ``expired`` or the ttl
  count runs out.
* **Renewal.** Every ttl/3 after the last ask was sent, and the stream of
  sessions that end with it every grace/3; at once after opening (such a
  session is bound to the stream that renews it) and on every new stream;
  soon again after a failure.
* **Retries.** A request goes to the leader guess, else to the endpoints
  in turn. A not-the-leader answer that names the leader is retried there
  at once, without sleeping. Transport failures and timeouts back off
  (exponential, jittered) and never sleep past the call's deadline. A
  write whose answer may have been lost is reported as an unknown outcome,
  never as a failure.
"""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from . import errors

#: Default session ttl in seconds.
DEFAULT_TTL = 10.0
#: The ttl range the cluster accepts, in seconds.
TTL_MIN = 1.0
TTL_MAX = 3600.0
#: Default grace, in seconds, after which a session whose keep-alive stream
#: closed (its process died) ends, instead of at the end of its ttl. The
#: client renews such a session's stream every grace/3.
DEFAULT_END_ON_DISCONNECT = 0.75
#: The largest grace the cluster accepts, in seconds.
END_ON_DISCONNECT_MAX = 60.0
#: Fraction of the ttl the client leaves out of its own view of the lease.
DEFAULT_MARGIN = 0.1
#: Largest lock name, in UTF-8 bytes (the cluster's limit).
NAME_MAX_BYTES = 512
#: Largest holder value, in bytes (the cluster's limit).
VALUE_MAX_BYTES = 4096
#: Largest semaphore capacity (the cluster's limit).
CAPACITY_MAX = 1_000_000
#: How long one ordinary request may take before it is retried.
REQUEST_TIMEOUT = 5.0
#: How long an ordinary request is retried before giving up.
RETRY_DEADLINE = 15.0
#: First and largest pause between retries when no leader is known.
INITIAL_BACKOFF = 0.02
MAX_BACKOFF = 0.2
#: One attempt of a session acquire that waits without a timeout; the
#: retry (same seq) keeps the request's place in the queue.
FOREVER_ATTEMPT = 30.0
#: Give up at once when every endpoint refused the connection this often.
REFUSED_ROUNDS = 3
#: Metadata keys of a not-the-leader answer.
LEADER_KEY = "raftlock-leader"
NOT_LEADER_KEY = "raftlock-not-leader"
#: Pause before a keep-alive that failed is asked again.
RENEW_RETRY = 0.05
#: Shortest time a keep-alive ask waits for its answer.
MIN_ASK_WAIT = 0.2
#: Shortest silence (an ask of a session that ends with its stream
#: unanswered) after which the client tries a new stream; the silence
#: allowed is the grace, at most a third of the ttl, and at least this.
MIN_SILENCE = 1.0

#: gRPC channel options: reconnect quickly to a restarted node, and notice
#: a dead or cut-off node even while a wait is parked.
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 5000),
    ("grpc.keepalive_timeout_ms", 5000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.enable_retries", 0),
]

now = time.monotonic


# ---------------------------------------------------------------- arguments


def parse_endpoints(endpoints: Union[str, Sequence[str]]) -> List[str]:
    """``host:port`` addresses from a list or one comma-separated string."""
    if isinstance(endpoints, (bytes, bytearray)):
        endpoints = endpoints.decode()
    if isinstance(endpoints, str):
        endpoints = endpoints.split(",")
    try:
        items = list(endpoints)
    except TypeError:
        raise errors.ConfigError(
            f"endpoints must be a list of 'host:port' or one comma-separated string, got {endpoints!r}"
        ) from None
    out = []
    for e in items:
        if not isinstance(e, str):
            raise errors.ConfigError(f"an endpoint must be a 'host:port' string, got {e!r}")
        e = e.strip()
        for scheme in ("http://", "https://"):
            if e.startswith(scheme):
                e = e[len(scheme):]
        e = e.rstrip("/")
        if not e:
            continue
        host, sep, port = e.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise errors.ConfigError(f"bad endpoint {e!r}: expected 'host:port'")
        out.append(e)
    if not out:
        raise errors.ConfigError("no endpoints given")
    return out


def auth_metadata(token: Optional[str]) -> Tuple[Tuple[str, str], ...]:
    """The metadata that carries ``token`` (none without one)."""
    if token is None:
        return ()
    if not isinstance(token, str):
        raise errors.ConfigError("the token must be a string")
    token = token.strip()
    if not token or any(c.isspace() for c in token) or not token.isprintable() or not token.isascii():
        raise errors.ConfigError("the token must be non-empty printable ASCII without spaces")
    return (("authorization", f"Bearer {token}"),)


def read_pem(what: str, value: Union[None, str, bytes, os.PathLike]) -> Optional[bytes]:
    """PEM bytes given as bytes, as PEM text, or as a file path."""
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str) and "-----BEGIN" in value:
        return value.encode()
    try:
        with open(value, "rb") as f:
            return f.read()
    except (OSError, TypeError) as e:
        raise errors.ConfigError(f"cannot read the {what} {value!r}: {e}") from None


def seconds(what: str, value: object) -> float:
    """``value`` as a finite number of seconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise errors.InvalidArgument(f"{what} must be a number of seconds, got {value!r}")
    v = float(value)
    if v != v or v in (float("inf"), float("-inf")):
        raise errors.InvalidArgument(f"{what} must be finite, got {value!r}")
    return v


def ttl_ms(ttl: object) -> int:
    """A session ttl in seconds as the cluster's milliseconds, checked."""
    t = seconds("ttl", ttl)
    ms = round(t * 1000)
    if not TTL_MIN * 1000 <= ms <= TTL_MAX * 1000:
        raise errors.InvalidArgument(f"ttl must be {TTL_MIN:g}..={TTL_MAX:g} s, got {ttl!r}")
    return ms


def grace_ms(grace: object) -> int:
    """``end_on_disconnect`` in seconds (None or 0: off) as milliseconds."""
    if grace is None or grace is False:
        return 0
    g = seconds("end_on_disconnect", grace)
    if not 0 <= g <= END_ON_DISCONNECT_MAX:
        raise errors.InvalidArgument(
            f"end_on_disconnect must be 0..={END_ON_DISCONNECT_MAX:g} s, got {grace!r}"
        )
    return max(1, round(g * 1000)) if g > 0 else 0


def timeout_fields(timeout: object) -> Tuple[int, bool]:
    """``(timeout_ms, wait)`` for a wait of ``timeout`` seconds
    (None: without a timeout; 0: try once)."""
    if timeout is None:
        return 0, True
    t = seconds("timeout", timeout)
    if t < 0:
        raise errors.InvalidArgument(f"timeout must be >= 0 or None, got {timeout!r}")
    # Below u64::MAX, which the cluster also reads as "no timeout".
    return min(round(t * 1000), 2**64 - 2), False


def check_margin(margin: object) -> float:
    m = seconds("margin", margin)
    if not 0 <= m <= 0.5:
        raise errors.InvalidArgument(f"margin must be a fraction 0..=0.5 of the ttl, got {margin!r}")
    return m


def check_on_lost(on_lost: object) -> Optional[Callable[[str, int], object]]:
    """A client's ``on_lost``: None, or a callable taking (name, fence)."""
    if on_lost is not None and not callable(on_lost):
        raise errors.ConfigError(f"on_lost must be a callable taking (name, fence), got {on_lost!r}")
    return on_lost


def check_name(name: object) -> str:
    """A lock name is a str of 1..=NAME_MAX_BYTES bytes of UTF-8 (the
    cluster's rule), checked before anything is sent."""
    if not isinstance(name, str):
        raise errors.InvalidArgument(f"a lock name must be a str, got {name!r}")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise errors.InvalidArgument(f"a lock name must be valid UTF-8: {e}") from None
    if not 1 <= size <= NAME_MAX_BYTES:
        raise errors.InvalidArgument(f"a lock name of {size} bytes: must be 1..={NAME_MAX_BYTES} bytes of UTF-8")
    return name


def check_value(value: object) -> bytes:
    if value is None:
        return b""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise errors.InvalidArgument(f"a holder value must be bytes or str, got {value!r}")


def mode_fields(shared: bool, capacity: object, weight: object) -> Tuple[int, int, int]:
    """``(mode, weight, capacity)`` of an acquire: a lock (exclusive or
    shared) without ``capacity``, semaphore permits with it."""
    if capacity is None:
        if weight != 1:
            raise errors.InvalidArgument("weight is for semaphores: give capacity too")
        return (1 if shared else 0), 0, 0
    if shared:
        raise errors.InvalidArgument("a semaphore has no shared mode: give capacity or shared, not both")
    for what, v in (("capacity", capacity), ("weight", weight)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise errors.InvalidArgument(f"{what} must be an int, got {v!r}")
        # Beyond uint32 the message cannot carry it; the cluster checks the rest.
        if not 0 <= v < 2**32:
            raise errors.InvalidArgument(f"{what} must be 1..={CAPACITY_MAX}, got {v!r}")
    return 2, int(weight), int(capacity)


#: ``Mode`` numbers of locks.proto.
MODE_EXCLUSIVE, MODE_SHARED, MODE_SEMAPHORE = 0, 1, 2
MODE_NAMES = {MODE_EXCLUSIVE: "exclusive", MODE_SHARED: "shared", MODE_SEMAPHORE: "semaphore"}


def not_all_acquired(names: List[str], timeout: Optional[float]) -> str:
    if timeout == 0:
        return f"{names!r} are not all free at once"
    return f"{names!r} were not granted together within {timeout} s"


def not_upgraded(name: str, timeout: Optional[float]) -> str:
    if timeout == 0:
        return f"{name!r} has other holders: not upgraded (the read is still held)"
    return f"{name!r} was not upgraded within {timeout} s (the read is still held)"


#: Names in one ``acquire_all`` (the cluster's limit per ``AcquireAll``).
ACQUIRE_ALL_MAX = 64


def lock_specs(locks: object) -> List[Tuple[str, bool, Optional[int], int]]:
    """``(name, shared, capacity, weight)`` of each item of an
    ``acquire_all``: a name (an exclusive lock) or a dict with ``name`` and
    any of ``shared``, ``capacity``, ``weight`` (as ``acquire`` takes
    them). 1..=ACQUIRE_ALL_MAX items, each name once; checked before
    anything is sent."""
    if isinstance(locks, (str, bytes)) or not isinstance(locks, Sequence):
        raise errors.InvalidArgument(f"acquire_all takes a list of names or dicts, got {locks!r}")
    if not 1 <= len(locks) <= ACQUIRE_ALL_MAX:
        raise errors.InvalidArgument(f"acquire_all takes 1..={ACQUIRE_ALL_MAX} names, got {len(locks)}")
    out = []
    seen = set()
    for item in locks:
        if isinstance(item, str):
            spec = (item, False, None, 1)
        elif isinstance(item, dict):
            unknown = set(item) - {"name", "shared", "capacity", "weight"}
            if "name" not in item or unknown:
                raise errors.InvalidArgument(
                    f"an acquire_all item takes name, shared, capacity, weight; got {sorted(item)!r}")
            spec = (item["name"], bool(item.get("shared", False)), item.get("capacity"), item.get("weight", 1))
        else:
            raise errors.InvalidArgument(f"an acquire_all item is a name or a dict, got {item!r}")
        name = check_name(spec[0])
        if name in seen:
            raise errors.InvalidArgument(f"acquire_all names {name!r} twice")
        seen.add(name)
        mode_fields(spec[1], spec[2], spec[3])
        out.append(spec)
    return out


# --------------------------------------------------------------- errors


def leader_named(metadata) -> Optional[str]:
    """The leader an answer's initial metadata names (a follower that
    forwarded the request adds it), if any."""
    for k, v in metadata or ():
        if k == LEADER_KEY:
            return (v.decode() if isinstance(v, bytes) else v) or None
    return None


def status_of(err: BaseException) -> Tuple[str, str, Dict[str, str]]:
    """``(code name, details, metadata)`` of a gRPC error (sync or aio)."""
    code = err.code() if callable(getattr(err, "code", None)) else None
    name = getattr(code, "name", "UNKNOWN") or "UNKNOWN"
    details = (err.details() if callable(getattr(err, "details", None)) else "") or ""
    md: Dict[str, str] = {}
    for getter in ("initial_metadata", "trailing_metadata"):
        f = getattr(err, getter, None)
        if not callable(f):
            continue
        try:
            items = f() or ()
        except Exception:  # noqa: BLE001 - metadata is a hint only
            items = ()
        for k, v in items:
            if isinstance(v, bytes):
                v = v.decode(errors="replace")
            md[str(k).lower()] = v
    return name, details, md


_BY_CODE = {
    "INVALID_ARGUMENT": errors.InvalidArgument,
    "OUT_OF_RANGE": errors.InvalidArgument,
    "FAILED_PRECONDITION": errors.FailedPrecondition,
    "ABORTED": errors.Deadlock,
    "NOT_FOUND": errors.SessionNotFound,
    "RESOURCE_EXHAUSTED": errors.ResourceExhausted,
    "UNAUTHENTICATED": errors.Unauthenticated,
    "PERMISSION_DENIED": errors.PermissionDenied,
    "UNAVAILABLE": errors.Unavailable,
}


def error_for(code: str, details: str) -> errors.RaftlockError:
    """The error for a status the cluster answered with."""
    cls = _BY_CODE.get(code, errors.RaftlockError)
    e = cls(f"{code}: {details}" if details else code)
    e.code = code
    return e


# ---------------------------------------------------------------- retries


class Endpoints:
    """The endpoints and the leader guess, shared by every call of a
    client (thread-safe)."""

    def __init__(self, endpoints: List[str]) -> None:
        self.all = endpoints
        self._lock = threading.Lock()
        self._leader: Optional[str] = None
        self._next = 0

    def target(self) -> str:
        """The leader guess, else the next endpoint in turn."""
        with self._lock:
            if self._leader is not None:
                return self._leader
            addr = self.all[self._next % len(self.all)]
            self._next += 1
            return addr

    def set_leader(self, addr: Optional[str]) -> None:
        with self._lock:
            self._leader = addr

    def forget(self, addr: str) -> None:
        with self._lock:
            if self._leader == addr:
                self._leader = None


def refused(details: str) -> bool:
    """Whether a transport failure is a connection nobody accepted, or an
    address that does not resolve (the request never left)."""
    d = details.lower()
    return (
        "connection refused" in d
        or "failed to connect to all addresses" in d
        or "errors resolving" in d
        or "dns resolution failed" in d
    )


class Attempts:
    """The retry policy of one call. The driver asks :meth:`budget` before
    each attempt, then reports the attempt's end; :meth:`failed` and
    :meth:`timed_out` answer how long to pause before the next attempt
    (0: at once, for a leader hint) or raise the final error."""

    def __init__(self, endpoints: Endpoints, write: bool, deadline: float) -> None:
        self.endpoints = endpoints
        self.write = write
        self.deadline = deadline
        self.started = now()
        self.backoff = INITIAL_BACKOFF
        self.sent = False  # a write may have been applied
        self.hops = 0
        self.tried: Dict[str, str] = {}
        self.refusals: Dict[str, int] = {}
        # Endpoints that answered that they do not serve this call.
        self.unserved: set = set()

    def budget(self, attempt_timeout: Optional[float]) -> Optional[float]:
        """How long the next attempt may take (None: no limit); raises the
        final error if the deadline has passed."""
        left = self.deadline - now()
        if left <= 0:
            raise self.give_up()
        if attempt_timeout is None:
            return None if self.deadline == float("inf") else left
        return min(attempt_timeout, left)

    def succeeded(self, addr: str, metadata=None) -> None:
        """The attempt at ``addr`` was answered. A follower forwards to the
        leader and names it in the answer's metadata (``raftlock-leader``):
        the next call goes there directly."""
        self.endpoints.set_leader(leader_named(metadata) or addr)

    def timed_out(self, addr: str, budget: Optional[float]) -> float:
        """The attempt at ``addr`` got no answer within ``budget``."""
        self.sent |= self.write
        self.endpoints.forget(addr)
        self.tried[addr] = f"did not answer within {budget:.1f} s" if budget else "did not answer"
        self.refusals.pop(addr, None)
        return self.pause()

    def failed(self, addr: str, err: BaseException) -> float:
        """The attempt at ``addr`` ended with gRPC error ``err``."""
        code, details, md = status_of(err)
        if code == "UNAVAILABLE":
            hint = md.get(LEADER_KEY) or None
            not_leader = NOT_LEADER_KEY in md
            was_refused = refused(details)
            if not not_leader and not was_refused:
                self.sent |= self.write
            if not_leader:
                self.tried[addr] = (
                    f"not the leader (the leader is {hint})" if hint else "not the leader, and knows no leader"
                )
            else:
                self.tried[addr] = details or "unavailable"
            if was_refused:
                self.refusals[addr] = self.refusals.get(addr, 0) + 1
            else:
                self.refusals.pop(addr, None)
            if hint and hint != addr and self.hops < 3:
                # Follow the hint at once: no sleep.
                self.hops += 1
                self.endpoints.set_leader(hint)
                return 0.0
            self.hops = 0
            self.endpoints.forget(addr)
            if all(self.refusals.get(e, 0) >= REFUSED_ROUNDS for e in self.endpoints.all):
                raise errors.Unreachable(
                    "no node accepts connections (each refused or did not resolve every attempt): " + self.summary()
                )
            return self.pause()
        if code == "UNIMPLEMENTED":
            # Not a raftlock node, or one without this call: another
            # service on a dead node's port, an older raftlock during an
            # upgrade. Nothing was done there: ask the others at once; once
            # every endpoint has answered so, that is the answer.
            self.endpoints.forget(addr)
            self.tried[addr] = f"does not serve this call: {details or code}"
            self.refusals.pop(addr, None)
            self.unserved.add(addr)
            if all(e in self.unserved for e in self.endpoints.all):
                raise error_for(code, "no endpoint serves the call: " + self.summary())
            return 0.0
        if code in ("DEADLINE_EXCEEDED", "CANCELLED", "UNKNOWN"):
            self.sent |= self.write
            self.endpoints.forget(addr)
            self.tried[addr] = f"{code}: {details}"
            return self.pause()
        raise error_for(code, details)

    def pause(self) -> float:
        """The next backoff delay; raises the final error, without
        sleeping, if it would end after the deadline."""
        delay = self.backoff * random.uniform(0.5, 1.5)
        self.backoff = min(self.backoff * 2, MAX_BACKOFF)
        if now() + delay >= self.deadline:
            raise self.give_up()
        return delay

    def summary(self) -> str:
        if not self.tried:
            return "no attempt fitted in the deadline"
        return "; ".join(f"{a}: {why}" for a, why in self.tried.items())

    def give_up(self) -> errors.RaftlockError:
        why = f"no node could serve the request within {now() - self.started:.1f} s: {self.summary()}"
        if self.sent:
            return errors.OutcomeUnknown(why)
        return errors.Unavailable(why)


def deadline_after(seconds_: Optional[float]) -> float:
    return float("inf") if seconds_ is None else now() + seconds_


# ------------------------------------------------------------ lease view

PENDING, VALID, LOST, CLOSED = "pending", "valid", "lost", "closed"
INF = float("inf")


class Lease:
    """One session's view of its lease (see the module doc).

    Belief ends at the earlier of two instants:

    * ``until``: the send time of the last lease-starting request answered
      (the open, a keep-alive), plus the ttl, less the margin;
    * ``grace_until``, for a session that ends with its stream
      (``end_on_disconnect``): the leader ends such a session ``grace``
      after the last stream that renewed it closes, and that stream (or the
      open's own call) may close (a dead connection, noticed by the leader)
      at any moment after the last ask it answered was sent. So the view
      lasts only until the latest such send time (the open's, from the
      start) plus the grace, less the margin; the client renews often
      enough (every grace/3) to keep it ahead.

    Three states follow (docs/concepts/sessions-and-leases.md, "The lease rule"):

    * **held** (:meth:`valid`): before both instants;
    * **jeopardy**: past them, but the ttl count (``lost_at``) has not run
      out. Not valid (the stream may have closed and the session ended a
      grace later), but not lost either: nobody is told, the session is
      still renewed, and the next answered keep-alive makes it valid again,
      since it proves that the session, and so every grant it had, was
      never ended in between (a slow network, a leader change);
    * **lost** (:meth:`is_lost`, final): the cluster said the session is
      gone (``expired``), or ``lost_at`` passed with no keep-alive
      answered: the *receive* time of the last lease-starting answer plus
      the ttl, less the margin (it only decides when to give up, so it
      counts from when the answer came: an answer that took long still
      leaves a whole ttl). An answer that comes after ``lost_at``, or
      later than its ask waits (:func:`ask_wait`), is not credited (as in
      the Rust client): it never brings the lease back.

    A lease starts ``pending``: :meth:`activate` hands it out once the
    open's answer (or the first keep-alive's) stands. Each change is one
    assignment under the GIL."""

    def __init__(self, session_id: int, ttl: float, margin: float, sent_at: float, grace: float = 0.0,
                 received_at: Optional[float] = None) -> None:
        self.session_id = session_id
        self.ttl = ttl
        self.margin_fraction = margin
        self.margin = ttl * margin
        self.grace = grace
        self.until = sent_at + ttl - self.margin
        self.lost_at = (sent_at if received_at is None else received_at) + ttl - self.margin
        self.grace_until = sent_at + grace * (1 - margin) if grace > 0 else INF
        self.state = PENDING
        #: Called (by the keep-alive driver, once) when the lease is lost;
        #: its session tells ``on_lost`` of each lock it holds.
        self.on_lost: Optional[Callable[[], None]] = None
        self.notified = False

    def deadline(self) -> float:
        """When the view runs out (on the monotonic clock)."""
        return min(self.until, self.grace_until)

    def valid(self, at: Optional[float] = None) -> bool:
        """True while the view says the lease is held."""
        if self.state not in (PENDING, VALID):
            return False
        return (now() if at is None else at) < self.deadline()

    def is_lost(self, at: Optional[float] = None) -> bool:
        """True once the lease is lost: the cluster said the session is
        gone, or the ttl count (``lost_at``) passed; final (a closed session
        is not lost)."""
        if self.state == VALID and (now() if at is None else at) >= self.lost_at:
            self.state = LOST
        return self.state == LOST

    def activate(self) -> bool:
        """Hands the lease out (held, or in jeopardy); False if it is
        lost."""
        if self.state == PENDING:
            self.state = VALID
        return not self.is_lost()

    def extend(self, sent_at: float, ttl: float, received_at: Optional[float] = None) -> None:
        """An ask sent at ``sent_at`` was answered with ``ttl`` (at
        ``received_at``)."""
        if self.state in (PENDING, VALID):
            self.until = max(self.until, sent_at + ttl - self.margin)
            got = sent_at if received_at is None else received_at
            self.lost_at = max(self.lost_at, got + ttl - self.margin)

    def bind(self, proof: float) -> None:
        """A stream that renewed the session was open on the leader at
        ``proof`` (the send time of an ask it answered)."""
        if self.grace > 0:
            self.grace_until = max(self.grace_until, proof + self.grace * (1 - self.margin_fraction))

    def mark_lost(self) -> None:
        if self.state in (PENDING, VALID):
            self.state = LOST

    def mark_closed(self) -> None:
        self.state = CLOSED


@dataclass
class Ask:
    """One keep-alive request on the stream."""

    session_id: int
    ask_id: int
    sent_at: float
    deadline: float
    stream: int = 0


def ask_wait(lease: Lease) -> float:
    """How long a keep-alive ask of ``lease`` waits for its answer before
    it is asked again (and, if nothing at all came back on the stream, the
    stream is taken for stalled): for a session that ends with its stream,
    the grace, at most a third of the ttl, at least ``MIN_SILENCE``
    (leaving a stream starts the grace on the leader if no other stream
    renews the session, so a short silence must not); otherwise a third of
    the ttl, at least ``MIN_ASK_WAIT``."""
    if lease.grace > 0:
        return max(MIN_SILENCE, min(lease.grace, lease.ttl / 3))
    return max(lease.ttl / 3, MIN_ASK_WAIT)


@dataclass
class _Entry:
    lease: Lease
    due: Optional[float]  # next ask; None while one is in flight
    answers: int = 0  # answers credited so far
    bound: int = 0  # the stream that last renewed it (0: none)


class Renewals:
    """The keep-alive schedule of every session of a client, on its one
    stream at a time. Not thread-safe: the driver holds its own lock
    around it."""

    def __init__(self) -> None:
        self.entries: Dict[int, _Entry] = {}
        self.inflight: Dict[int, Ask] = {}
        self.last_ask_id = 0
        self.last_answer = -INF
        self.streams = 0  # streams opened so far
        self.current = 0  # the open stream (0: none)
        self.proof: Dict[int, float] = {}
        self.expired: List[Lease] = []  # lost (answered expired, or pruned past the ttl count), not yet taken

    def add(self, lease: Lease, first: float) -> None:
        self.entries[lease.session_id] = _Entry(lease, first)

    def remove(self, session_id: int) -> None:
        self.entries.pop(session_id, None)
        for k in [k for k, a in self.inflight.items() if a.session_id == session_id]:
            del self.inflight[k]

    def prune(self, at: float) -> None:
        """Stops renewing sessions that are gone: expired, past their ttl
        count (lost: their holders are told, see :meth:`take_lost`), or
        closed."""
        for sid, e in list(self.entries.items()):
            if e.lease.is_lost(at) and not e.lease.notified:
                self.expired.append(e.lease)
            if e.lease.state in (LOST, CLOSED):
                self.remove(sid)

    def stream_opened(self, at: float) -> int:
        """A new stream is open: every session is renewed on it at once, so
        that those that end with their stream are bound to it before the
        grace the old one started runs out."""
        self.streams += 1
        self.current = self.streams
        self.proof[self.current] = -INF
        for e in self.entries.values():
            if e.due is not None:
                e.due = min(e.due, at)
        return self.current

    def _ping_due(self) -> Optional[float]:
        """When the open stream needs an answered ask again to keep its
        bound sessions' views ahead (None: no bound session)."""
        graces = [e.lease.grace for e in self.entries.values() if e.bound == self.current and e.lease.grace > 0]
        if not self.current or not graces:
            return None
        return self.proof.get(self.current, -INF) + min(graces) / 3

    def due(self, at: float) -> List[Ask]:
        """The asks to send now on the open stream (each with a fresh id)."""
        self.prune(at)
        ping = self._ping_due()
        if ping is not None and ping <= at and not any(a.stream == self.current for a in self.inflight.values()):
            bound = [e for e in self.entries.values() if e.bound == self.current and e.due is not None]
            if bound:
                min(bound, key=lambda e: e.due).due = at
        out = []
        for sid, e in list(self.entries.items()):
            if e.due is not None and e.due <= at:
                self.last_ask_id += 1
                ask = Ask(sid, self.last_ask_id, at, at + ask_wait(e.lease), self.current)
                self.inflight[ask.ask_id] = ask
                e.due = None
                out.append(ask)
        return out

    def answer(self, session_id: int, ask_id: int, ttl_ms: int, expired: bool, at: float) -> Optional[Lease]:
        """An answer arrived; the lease it concerns, if it was wanted."""
        self.last_answer = at
        ask = self.inflight.get(ask_id) if ask_id else self._oldest_of(session_id)
        if ask is None or ask.session_id != session_id:
            return None  # an answer to an ask given up on: never credited to a newer one
        del self.inflight[ask.ask_id]
        e = self.entries.get(session_id)
        if e is None:
            return None
        if not expired and not e.lease.is_lost(at) and at > ask.deadline:
            # Later than its ask waits (the driver gives an ask up then and
            # asks again; it may just not have looked yet): as in the Rust
            # client, not credited, so it neither makes the lease valid
            # again nor pushes back the ttl count. The session asks again.
            self._retry(session_id, at)
            return None
        e.answers += 1
        if e.lease.is_lost(at):
            # Marked lost, or the ttl count ran out, before this answer
            # came: lost for good (prune tells its holders), as in the Rust
            # client, which gives the lease up at that deadline.
            return e.lease
        if expired:
            e.lease.mark_lost()
            del self.entries[session_id]
            self.expired.append(e.lease)
            return e.lease
        e.lease.extend(ask.sent_at, ttl_ms / 1000.0, at)
        if ask.stream:
            self.proof[ask.stream] = max(self.proof.get(ask.stream, -INF), ask.sent_at)
            if e.lease.grace > 0:
                e.bound = ask.stream
            for other in self.entries.values():
                if other.bound == ask.stream:
                    other.lease.bind(self.proof[ask.stream])
        e.due = ask.sent_at + e.lease.ttl / 3
        return e.lease

    def _oldest_of(self, session_id: int) -> Optional[Ask]:
        asks = [a for a in self.inflight.values() if a.session_id == session_id]
        return min(asks, key=lambda a: a.ask_id) if asks else None

    def overdue(self, at: float) -> bool:
        """Drops the asks past their deadline (their sessions ask again
        soon); True if the stream looks stalled: nothing at all came back
        since one of them was sent."""
        stalled = False
        for k, a in list(self.inflight.items()):
            if a.deadline <= at:
                del self.inflight[k]
                stalled |= self.last_answer < a.sent_at
                self._retry(a.session_id, at)
        return stalled

    def stream_failed(self, at: float) -> None:
        """The open stream ended (or was left for a new one): every ask on
        it is given up, and their sessions ask again soon on the next
        stream. The grace counts go on (the client cannot tell whether the
        leader started a grace)."""
        for a in self.inflight.values():
            self._retry(a.session_id, at)
        self.inflight.clear()
        self.current = 0

    def all_bound(self) -> bool:
        """True when every session that ends with its stream has been
        renewed on the open stream (a stream left for it may be closed
        then without starting a grace)."""
        return bool(self.current) and all(
            e.bound == self.current for e in self.entries.values() if e.lease.grace > 0)

    def _retry(self, session_id: int, at: float) -> None:
        e = self.entries.get(session_id)
        if e is not None and e.due is None:
            e.due = at + RENEW_RETRY

    def renew_now(self, session_id: int, at: float) -> int:
        """Asks for a keep-alive of the session at once (unless one is in
        flight); the number of answers it has had so far."""
        e = self.entries[session_id]
        if e.due is not None:
            e.due = at
        return e.answers

    def take_lost(self, at: float) -> List[Lease]:
        """The leases that are lost (answered expired, or past their ttl
        count) and were not taken before: each is taken once, for its
        holders to be told (``Lease.on_lost``). A lease in jeopardy is not
        lost."""
        lost = [lz for lz in self.expired if not lz.notified]
        self.expired.clear()
        lost.extend(e.lease for e in self.entries.values() if not e.lease.notified and e.lease.is_lost(at))
        for lz in lost:
            lz.notified = True
        return lost

    def next_wakeup(self, at: float) -> Optional[float]:
        """When the driver must look again (None: nothing scheduled)."""
        times = [e.due for e in self.entries.values() if e.due is not None]
        # When a held lease's ttl count runs out: it is lost then (its
        # holders are told, its renewals stop).
        times.extend(e.lease.lost_at for e in self.entries.values() if e.lease.state == VALID)
        times.extend(a.deadline for a in self.inflight.values())
        ping = self._ping_due()
        if ping is not None:
            times.append(ping)
        return min(times) if times else None


# ------------------------------------------------------------------ reads

MODES = {0: "exclusive", 1: "shared", 2: "semaphore"}


@dataclass(frozen=True)
class Holder:
    """A holder of a lock or of semaphore permits."""

    session_id: int
    fence: int
    mode: str  # "exclusive", "shared" or "semaphore"
    weight: int
    value: bytes


@dataclass(frozen=True)
class Waiter:
    """A queued request, in FIFO order."""

    session_id: int
    seq: int
    mode: str
    weight: int


@dataclass(frozen=True)
class LockInfo:
    """The state of one lock or semaphore (``Client.describe``)."""

    name: str
    semaphore: bool
    capacity: int
    holders: Tuple[Holder, ...]
    waiters: Tuple[Waiter, ...]
    lock_delayed: bool


def lock_info(info) -> LockInfo:
    """A ``LockInfo`` from the protobuf message."""
    return LockInfo(
        name=info.name,
        semaphore=info.semaphore,
        capacity=info.capacity,
        holders=tuple(
            Holder(h.session_id, h.fence, MODES.get(h.mode, str(h.mode)), h.weight, bytes(h.value))
            for h in info.holders
        ),
        waiters=tuple(Waiter(w.session_id, w.seq, MODES.get(w.mode, str(w.mode)), w.weight) for w in info.waiters),
        lock_delayed=info.lock_delayed,
    )
