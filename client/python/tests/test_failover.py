"""A leader killed with SIGKILL under a held lock and a waiting acquire:
three ``raftlockd run`` processes, so one can die."""

import json
import signal
import subprocess
import threading
import time
import urllib.request

import pytest

import raftlock

from conftest import free_run, raftlockd, wait_for


def status(addr):
    req = urllib.request.Request(f"http://{addr}/v1/cluster/Status", data=b"{}", method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=1) as r:
        return json.load(r)


class RunCluster:
    def __init__(self, dir):
        self.dir = dir
        base = free_run(3)
        self.addrs = [f"127.0.0.1:{base + i}" for i in range(3)]
        peers = ",".join(f"{i + 1}={a}" for i, a in enumerate(self.addrs))
        self.procs = {}
        for i, addr in enumerate(self.addrs):
            args = [raftlockd(), "run", "--id", str(i + 1), "--listen", addr, "--data-dir", str(dir / f"node-{i + 1}"),
                    "--insecure-peers"]
            if i == 0:
                args += ["--peers", peers, "--init"]
            log = open(dir / f"node-{i + 1}.log", "w")
            self.procs[addr] = subprocess.Popen(args, stdout=log, stderr=log)

    def leader(self, among=None):
        for a in among or self.addrs:
            try:
                s = status(a)
            except OSError:
                continue
            if s.get("leader_addr") and s.get("leader_addr") in (among or self.addrs):
                return s["leader_addr"]
        return None

    def stop(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()


@pytest.fixture
def run_cluster(tmp_path):
    c = RunCluster(tmp_path)
    try:
        wait_for(lambda: c.leader() and all(status(a).get("leader_addr") for a in c.addrs), "a leader", timeout=30,
                 every=0.1)
        yield c
    finally:
        c.stop()


def test_a_lock_and_a_wait_survive_the_leaders_death(run_cluster):
    c = run_cluster
    client = raftlock.Client(c.addrs)
    name = "failover/lock"
    holder = client.lock(name, ttl=10)
    assert holder.acquire()
    waiter_session = client.session(ttl=10)
    got = {}

    def wait():
        try:
            got["lock"] = waiter_session.acquire(name, timeout=None)
        except Exception as e:  # noqa: BLE001 - reported below
            got["error"] = e

    t = threading.Thread(target=wait)
    t.start()
    wait_for(lambda: client.describe(name).waiters, "the waiter to queue")
    old = c.leader()
    c.procs[old].send_signal(signal.SIGKILL)
    c.procs[old].wait()
    survivors = [a for a in c.addrs if a != old]
    wait_for(lambda: c.leader(survivors), "a new leader", timeout=30, every=0.1)
    # The client follows the new leader; the session and its grant are there,
    # and the client's view comes back once its keep-alive is answered there.
    wait_for(lambda: not holder.lost, "the holder's view to hold again", timeout=10)
    assert client.check_fence(name, holder.fence)
    info = client.describe(name)
    assert [w.session_id for w in info.waiters] == [waiter_session.id]
    # The wait was re-sent with the same seq to the new leader: released
    # now, it is granted (a new seq would have been refused as a second
    # acquire of a name the session waits for).
    assert holder.release() is True
    t.join(20)
    assert "error" not in got, got.get("error")
    assert got["lock"].fence > holder.fence
    assert not got["lock"].lost
    waiter_session.close()
    client.close()
