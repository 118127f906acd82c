"""raftlock: a client for the raftlock lock service (sync API; the asyncio
one, with the same names, is ``raftlock.aio``).

    import raftlock

    client = raftlock.Client("127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103")
    with client.lock("jobs/nightly", ttl=10.0, timeout=5.0) as lock:
        store.write(data, fence=lock.fence)   # the store rejects stale fences
        if lock.lost:
            ...                               # the lease may have lapsed

See client/python/README.md.
"""

from ._core import (
    ACQUIRE_ALL_MAX,
    CAPACITY_MAX,
    DEFAULT_END_ON_DISCONNECT,
    DEFAULT_MARGIN,
    DEFAULT_TTL,
    END_ON_DISCONNECT_MAX,
    NAME_MAX_BYTES,
    TTL_MAX,
    TTL_MIN,
    VALUE_MAX_BYTES,
    Holder,
    LockInfo,
    Waiter,
)
from ._sync import Client, Lock, Session
from .errors import (
    ConfigError,
    Deadlock,
    FailedPrecondition,
    InvalidArgument,
    LeaseLost,
    NotAcquired,
    OutcomeUnknown,
    PermissionDenied,
    RaftlockError,
    ResourceExhausted,
    SessionNotFound,
    Unauthenticated,
    Unavailable,
    Unreachable,
)

__all__ = [
    "ACQUIRE_ALL_MAX",
    "CAPACITY_MAX",
    "DEFAULT_END_ON_DISCONNECT",
    "DEFAULT_MARGIN",
    "DEFAULT_TTL",
    "END_ON_DISCONNECT_MAX",
    "NAME_MAX_BYTES",
    "TTL_MAX",
    "TTL_MIN",
    "VALUE_MAX_BYTES",
    "Client",
    "ConfigError",
    "Deadlock",
    "FailedPrecondition",
    "Holder",
    "InvalidArgument",
    "LeaseLost",
    "Lock",
    "LockInfo",
    "NotAcquired",
    "OutcomeUnknown",
    "PermissionDenied",
    "RaftlockError",
    "ResourceExhausted",
    "Session",
    "SessionNotFound",
    "Unauthenticated",
    "Unavailable",
    "Unreachable",
    "Waiter",
]
