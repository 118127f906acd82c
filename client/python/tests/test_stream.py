"""The keep-alive stream against a stand-in node (a gRPC server on
loopback that answers OpenSession and KeepAlive as the test says), for what
a real cluster cannot be made to do on cue: a leader that stays connected
but answers nothing."""

import asyncio
import threading
from concurrent import futures

import grpc
import pytest

import raftlock
import raftlock.aio
from raftlock.v1 import locks_pb2 as pb
from raftlock.v1 import locks_pb2_grpc as pbg

from conftest import wait_for


class StandIn(pbg.LocksServicer):
    """Stream n (from 1) answers its ask k (from 1) if ``answer(n, k)``;
    ``events`` records, in order, each stream's first answer (just before
    it is sent) and each stream's end."""

    def __init__(self, answer):
        self.answer = answer
        self.streams = 0
        self.events = []
        self.mu = threading.Lock()

    def event(self, e):
        with self.mu:
            self.events.append(e)

    def OpenSession(self, request, context):
        return pb.OpenSessionResponse(session_id=7, ttl_ms=request.ttl_ms)

    def KeepAlive(self, request_iterator, context):
        with self.mu:
            self.streams += 1
            n = self.streams
        context.add_callback(lambda: self.event(f"closed {n}"))
        k = 0
        for req in request_iterator:
            k += 1
            if not self.answer(n, k):
                continue
            if k == 1:
                self.event(f"answer {n}")
            yield pb.KeepAliveResponse(session_id=req.session_id, ttl_ms=30000, ask_id=req.ask_id)


def serve(answer):
    node = StandIn(answer)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pbg.add_LocksServicer_to_server(node, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return node, f"127.0.0.1:{port}", server


@pytest.fixture
def stand_in():
    node, addr, server = serve(lambda stream, ask: stream != 1 or ask == 1)
    yield node, addr
    server.stop(0)


@pytest.fixture
def two_silences():
    """Stream 1 answers its first ask only, stream 2 nothing, stream 3 on
    everything."""
    node, addr, server = serve(lambda stream, ask: (stream == 1 and ask == 1) or stream >= 3)
    yield node, addr
    server.stop(0)


def check_order(node):
    wait_for(lambda: "closed 1" in node.events, "the silent stream closed", timeout=30.0)
    ev = list(node.events)
    assert ev[:3] == ["answer 1", "answer 2", "closed 1"], (
        f"events {ev}: want stream 1 answered, stream 2 answered, then stream 1 closed")


def test_a_silent_stream_is_closed_only_after_its_successor_renews(stand_in):
    """The leader stops answering on a stream that stays open: the client
    opens a new stream and closes the silent one only once the new one has
    renewed the session (closing it first would start the grace on the
    leader with no stream renewing the session)."""
    node, addr = stand_in
    client = raftlock.Client(addr)
    try:
        session = client.session(ttl=30)
        check_order(node)
        assert not session.lost
    finally:
        client.close()


def test_a_silent_stream_is_closed_only_after_its_successor_renews_aio(stand_in):
    node, addr = stand_in

    async def main():
        client = raftlock.aio.Client(addr)
        try:
            session = await client.session(ttl=30)
            await asyncio.get_running_loop().run_in_executor(None, check_order, node)
            assert not session.lost
        finally:
            await client.close()

    asyncio.run(main())


def check_oldest_kept(node):
    wait_for(lambda: "answer 3" in node.events and "closed 1" in node.events,
             "stream 3 answered and stream 1 closed", timeout=60.0)
    ev = list(node.events)
    print("events", ev)
    assert ev.index("closed 1") > ev.index("answer 3"), (
        f"events {ev}: stream 1 closed before any successor renewed (want it open until stream 3 answered)")


def test_the_oldest_silent_stream_stays_open_until_a_successor_renews(two_silences):
    """Two silences in a row (stream 1 stops answering, its replacement 2
    answers nothing either): stream 1, which carried the session, stays
    open until a successor (stream 3) has renewed; closing it earlier would
    start the leader's grace with no stream renewing the session."""
    node, addr = two_silences
    client = raftlock.Client(addr)
    try:
        session = client.session(ttl=30)
        check_oldest_kept(node)
        assert not session.lost
    finally:
        client.close()


def test_the_oldest_silent_stream_stays_open_until_a_successor_renews_aio(two_silences):
    node, addr = two_silences

    async def main():
        client = raftlock.aio.Client(addr)
        try:
            session = await client.session(ttl=30)
            await asyncio.get_running_loop().run_in_executor(None, check_oldest_kept, node)
            assert not session.lost
        finally:
            await client.close()

    asyncio.run(main())
