"""A leader killed with SIGKILL under a held lock and a waiting acquire:
three ``raftlockd run`` processes, so one can die."""

import signal
import threading

import pytest

import raftlock

from conftest import RunCluster, wait_for


@pytest.fixture
def run_cluster(tmp_path):
    c = RunCluster(tmp_path)
    try:
        c.wait_ready()
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
