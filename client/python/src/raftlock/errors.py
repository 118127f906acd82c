"""The errors this package raises. All derive from :class:`RaftlockError`.

An error that the cluster answered carries the gRPC status name in
``code`` (for example ``"FAILED_PRECONDITION"``) and the node's message.
"""

from __future__ import annotations


class RaftlockError(Exception):
    """Base of every error raised by this package."""

    #: The gRPC status name the cluster answered with ("" if none).
    code: str = ""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.message = message
        if code:
            self.code = code


class ConfigError(RaftlockError, ValueError):
    """Bad arguments to :class:`raftlock.Client` (endpoints, token, TLS files)."""


class InvalidArgument(RaftlockError, ValueError):
    """A request the cluster refuses as malformed (``INVALID_ARGUMENT``,
    ``OUT_OF_RANGE``), or one this package refuses before sending (a ttl
    out of range, a negative timeout). Nothing was changed."""

    code = "INVALID_ARGUMENT"


class NotAcquired(RaftlockError):
    """The lock (or permits) was not granted within the timeout
    (``timeout=0``: it was busy). Nothing is left queued or held."""

    def __init__(self, name: str, timeout: float | None, what: str | None = None) -> None:
        if what is not None:
            pass
        elif timeout == 0:
            what = f"{name!r} is held by another session"
        else:
            what = f"{name!r} was not granted within {timeout} s"
        super().__init__(what)
        self.name = name
        self.timeout = timeout


class FailedPrecondition(RaftlockError):
    """``FAILED_PRECONDITION``: the request conflicts with existing state: a
    semaphore capacity or kind mismatch, or a name this session already
    holds or waits for. Nothing was changed."""

    code = "FAILED_PRECONDITION"


class Deadlock(RaftlockError):
    """``ABORTED``: the acquire would close a wait-for cycle between
    sessions; the message names the cycle. Nothing was queued."""

    code = "ABORTED"


class SessionNotFound(RaftlockError):
    """``NOT_FOUND``: the session is unknown, closed or expired."""

    code = "NOT_FOUND"


class ResourceExhausted(RaftlockError):
    """``RESOURCE_EXHAUSTED``: a cluster limit was reached (waiters per
    name, locks per session, sessions), or the fence counter's bound."""

    code = "RESOURCE_EXHAUSTED"


class Unauthenticated(RaftlockError):
    """``UNAUTHENTICATED``: access control is on and the token (or client
    certificate) is missing or unknown."""

    code = "UNAUTHENTICATED"


class PermissionDenied(RaftlockError):
    """``PERMISSION_DENIED``: no rule of the cluster's ACL grants this."""

    code = "PERMISSION_DENIED"


class Unavailable(RaftlockError):
    """No node could serve the request before the client's retry deadline
    (no leader, nodes unreachable). The request was not applied."""

    code = "UNAVAILABLE"


class Unreachable(Unavailable):
    """No node could be asked: every endpoint refused the connection or its
    name did not resolve, three rounds in a row. Nothing was sent; the
    endpoints or the cluster are down or wrong. (Nodes that answered but had
    no leader give :class:`Unavailable` itself.)"""


class OutcomeUnknown(RaftlockError):
    """A write was sent but its answer never came (a timeout, a dropped
    connection, a leader change): it may or may not have been applied. An
    acquire in this state has been withdrawn (``Cancel``) by the client."""


class LeaseLost(RaftlockError):
    """The session is lost (no keep-alive answered within its ttl count, or
    the cluster said it expired): its grants may belong to others now."""
