"""The suite's real cluster: ``raftlockd dev`` started on free loopback
ports in a temporary directory, stopped at the end. The binary comes from
``$RAFTLOCKD``, else the workspace's ``target/debug/raftlockd`` (which
``cargo test --workspace`` builds before ``.ci/run`` runs this suite)."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
CHILD = HERE / "child.py"


def raftlockd() -> str:
    path = os.environ.get("RAFTLOCKD") or str(REPO / "target" / "debug" / "raftlockd")
    if not os.access(path, os.X_OK):
        pytest.exit(f"no raftlockd at {path}: build it (cargo build -p raftlock-node) or set RAFTLOCKD", 2)
    return path


def free_run(n: int) -> int:
    """A base port whose ``n`` consecutive ports are free now."""
    for _ in range(200):
        base = random.randrange(20000, 60000 - n)
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                s.bind(("127.0.0.1", p))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free run of ports")


class Cluster:
    """A ``raftlockd dev`` cluster of ``nodes`` nodes on loopback."""

    def __init__(self, tmp: Path, nodes: int = 3, acl: str | None = None) -> None:
        self.dir = tmp
        self.nodes = nodes
        self.proc = None
        args_acl = []
        if acl is not None:
            (tmp / "acl.toml").write_text(acl)
            args_acl = ["--acl-file", str(tmp / "acl.toml")]
        last = ""
        for _ in range(5):
            base = free_run(nodes)
            self.log = open(tmp / f"raftlockd-{base}.log", "w+")
            self.proc = subprocess.Popen(
                [raftlockd(), "dev", "--nodes", str(nodes), "--base-port", str(base),
                 "--data-dir", str(tmp / f"data-{base}"), "--metrics-base-port", "0", *args_acl],
                stdout=subprocess.PIPE, stderr=self.log, text=True,
            )
            self.addrs = []
            if self._ready(deadline=time.monotonic() + 30):
                return
            self.proc.kill()
            self.proc.wait()
            self.log.seek(0)
            last = self.log.read()[-2000:]
        raise RuntimeError(f"raftlockd dev did not get ready: {last}")

    def _ready(self, deadline: float) -> bool:
        lines = []

        def read():
            for line in self.proc.stdout:
                lines.append(line.strip())
                if line.strip() == "ready":
                    return

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(max(0.0, deadline - time.monotonic()))
        if "ready" not in lines:
            return False
        self.addrs = [line.split()[2] for line in lines if line.startswith("node ")]
        # Keep draining stdout so the node never blocks on a full pipe.
        threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()
        return len(self.addrs) == self.nodes

    @property
    def endpoints(self) -> str:
        return ",".join(self.addrs)

    def leader(self) -> str:
        """The leader's address, asked over HTTP/JSON of node 1."""
        import json
        import urllib.request

        deadline = time.monotonic() + 20
        while True:
            for a in self.addrs:
                try:
                    req = urllib.request.Request(f"http://{a}/v1/cluster/Status", data=b"{}", method="POST",
                                                 headers={"Content-Type": "application/json"})
                    with urllib.request.urlopen(req, timeout=2) as r:
                        leader = json.load(r).get("leader_addr")
                        if leader:
                            return leader
                except OSError:
                    pass
            assert time.monotonic() < deadline, "no leader"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def status(addr):
    req = urllib.request.Request(f"http://{addr}/v1/cluster/Status", data=b"{}", method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=1) as r:
        return json.load(r)


class RunCluster:
    """Three ``raftlockd run`` processes (one per node) on loopback, so that
    one node can be killed alone."""

    def __init__(self, dir, extra=()):
        """``extra``: flags for every node (e.g. its election timeouts)."""
        self.dir = dir
        base = free_run(3)
        self.addrs = [f"127.0.0.1:{base + i}" for i in range(3)]
        peers = ",".join(f"{i + 1}={a}" for i, a in enumerate(self.addrs))
        self.procs = {}
        self.args = {}
        for i, addr in enumerate(self.addrs):
            args = [raftlockd(), "run", "--id", str(i + 1), "--listen", addr, "--data-dir", str(dir / f"node-{i + 1}"),
                    "--insecure-peers", *extra]
            if i == 0:
                args += ["--peers", peers, "--init"]
            self.args[addr] = args
            self.start(addr)

    def start(self, addr):
        """Starts (again) the node at ``addr``, on its data directory."""
        log = open(self.dir / f"node-{self.addrs.index(addr) + 1}.log", "a")
        self.procs[addr] = subprocess.Popen(self.args[addr], stdout=log, stderr=log)

    def kill(self, addr):
        """SIGKILLs the node at ``addr`` and waits for it to end."""
        p = self.procs[addr]
        if p.poll() is None:
            p.kill()
        p.wait()

    def leader(self, among=None):
        for a in among or self.addrs:
            try:
                s = status(a)
            except OSError:
                continue
            if s.get("leader_addr") and s.get("leader_addr") in (among or self.addrs):
                return s["leader_addr"]
        return None

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Waits until a leader is elected and every node knows it."""

        def ready():
            try:
                return self.leader() and all(status(a).get("leader_addr") for a in self.addrs)
            except OSError:
                return False  # a node not listening yet

        wait_for(ready, "a leader known to every node", timeout=timeout, every=0.1)

    def stop(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("cluster"))
    yield c
    c.stop()


@pytest.fixture
def client(cluster):
    import raftlock

    c = raftlock.Client(cluster.endpoints)
    yield c
    c.close()


@pytest.fixture
def name():
    """A lock name of the test's own."""
    return f"test/{uuid.uuid4().hex[:12]}"


def wait_for(cond, what: str, timeout: float = 20.0, every: float = 0.02):
    """Polls ``cond`` until it returns a true value (returned), or fails."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


class Child:
    """A Python process running ``tests/child.py`` with the package, whose
    stdout lines the test reads."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, str(CHILD), *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.lines = []
        # stderr is read as it comes too: a child that fills an unread pipe
        # blocks on its next write (a log line) and never prints again.
        self.errors = []
        self._t = threading.Thread(target=self._read, args=(self.proc.stdout, self.lines), daemon=True)
        self._t.start()
        threading.Thread(target=self._read, args=(self.proc.stderr, self.errors), daemon=True).start()

    @staticmethod
    def _read(stream, into):
        for line in stream:
            into.append(line.rstrip("\n"))

    def expect(self, prefix: str, timeout: float = 20.0) -> str:
        def found():
            for line in self.lines:
                if line.startswith(prefix):
                    return line
            if self.proc.poll() is not None and not self._t.is_alive():
                raise AssertionError(
                    f"child exited ({self.proc.returncode}) before {prefix!r}: {self.lines} {self.errors}")
            return None

        try:
            return wait_for(found, f"child line {prefix!r}", timeout)
        except AssertionError as e:
            raise AssertionError(f"{e}; the child printed {self.lines} and on stderr {self.errors}") from None

    def signal(self, sig) -> None:
        self.proc.send_signal(sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def children():
    made = []

    def start(*args):
        c = Child(*args)
        made.append(c)
        return c

    yield start
    for c in made:
        c.stop()


def revoke_session(leader, session_id: int, within: float = 30.0) -> None:
    """Revokes ``session_id`` as an operator would: ``POST
    /v1/cluster/RevokeSession`` at ``leader()`` (a callable giving the
    leader's address), again while the answer is 503 (the leadership moved
    meanwhile) or no node answers. The call answers once the session has
    ended (up to its ttl). Another HTTP error, or no success within
    ``within`` seconds, raises AssertionError saying what came back."""
    body = json.dumps({"session_id": str(session_id)}).encode()
    deadline = time.monotonic() + within
    while True:
        req = urllib.request.Request(f"http://{leader()}/v1/cluster/RevokeSession", data=body,
                                     method="POST", headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                json.load(r)
                return
        except urllib.error.HTTPError as e:
            why = f"HTTP {e.code}: {e.read()[:500]!r}"
            if e.code != 503:
                raise AssertionError(f"RevokeSession of {session_id} answered {why}") from None
        except OSError as e:
            why = repr(e)
        if time.monotonic() >= deadline:
            raise AssertionError(f"RevokeSession of {session_id} did not succeed within {within:.0f} s: {why}")
        time.sleep(0.05)
