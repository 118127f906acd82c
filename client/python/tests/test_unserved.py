"""An endpoint that does not serve the call (a gRPC server without the
raftlock service: another service on a dead node's port, an older raftlock
during an upgrade) answers UNIMPLEMENTED. Nothing was done there, so the
client asks the other endpoints, as the Rust client does; only once every
endpoint has answered so does the call fail with that answer."""

import asyncio
from concurrent import futures

import grpc
import pytest

import raftlock
import raftlock.aio


class Bare:
    """A gRPC server with no service at all: every call is UNIMPLEMENTED.
    Counts the calls it was asked."""

    def __init__(self) -> None:
        self.asked = 0
        bare = self

        class Count(grpc.ServerInterceptor):
            def intercept_service(self, continuation, handler_call_details):
                bare.asked += 1
                return continuation(handler_call_details)

        self.server = grpc.server(futures.ThreadPoolExecutor(2), interceptors=[Count()])
        self.addr = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def stop(self) -> None:
        self.server.stop(0)


@pytest.fixture
def bare():
    servers = [Bare(), Bare()]
    yield servers
    for s in servers:
        s.stop()


def test_an_endpoint_that_does_not_serve_the_call_is_passed_over(cluster, bare, name):
    c = raftlock.Client([b.addr for b in bare] + cluster.endpoints.split(","))
    try:
        lock = c.lock(name, ttl=10, timeout=0)
        assert lock.acquire() is True
        assert lock.release() is True
    finally:
        c.close()
    assert all(b.asked > 0 for b in bare), "a stand-in was never asked: the test tests nothing"


def test_the_asyncio_client_passes_over_it_too(cluster, bare, name):
    async def main():
        async with raftlock.aio.Client([b.addr for b in bare] + cluster.endpoints.split(",")) as c:
            lock = c.lock(name, ttl=10, timeout=0)
            assert await lock.acquire() is True
            assert await lock.release() is True

    asyncio.run(asyncio.wait_for(main(), 60))
    assert all(b.asked > 0 for b in bare)


def test_no_endpoint_serves_the_call_fails_with_unimplemented_at_once(bare, name, monkeypatch):
    # A retry deadline of 10 minutes: the answer must come from the
    # endpoints having each said so, not from the deadline.
    monkeypatch.setattr(raftlock._core, "RETRY_DEADLINE", 600.0)
    c = raftlock.Client([b.addr for b in bare])
    try:
        with pytest.raises(raftlock.RaftlockError) as e:
            c.lock(name, ttl=10, timeout=0).acquire()
    finally:
        c.close()
    assert e.value.code == "UNIMPLEMENTED", e.value
    assert not isinstance(e.value, raftlock.Unavailable)
    for b in bare:
        assert b.asked >= 1
        assert b.addr in str(e.value), e.value
