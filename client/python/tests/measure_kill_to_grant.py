"""Measures how long after a holder process is SIGKILLed the next waiter
is granted, for the sync and the asyncio client (ttl 30 s, the default
end_on_disconnect grace). Not a test: run it by hand from this folder,

    RAFTLOCKD=../../../target/release/raftlockd python measure_kill_to_grant.py [ROUNDS]
"""

import pathlib
import signal
import sys
import tempfile
import threading
import time

import raftlock
from conftest import Child, Cluster, wait_for


def main(rounds: int) -> None:
    cluster = Cluster(pathlib.Path(tempfile.mkdtemp()))
    client = raftlock.Client(cluster.endpoints)
    try:
        for api in ("sync", "aio"):
            for i in range(rounds):
                name = f"measure/{api}/{i}"
                holder = Child("hold", api, cluster.endpoints, name, "30")
                holder.expect("held")
                granted = {}

                def wait():
                    with client.lock(name, timeout=30):
                        granted["at"] = time.monotonic()

                t = threading.Thread(target=wait)
                t.start()
                wait_for(lambda: client.describe(name).waiters, "the waiter to queue")
                killed = time.monotonic()
                holder.signal(signal.SIGKILL)
                t.join()
                holder.stop()
                print(f"{api}: kill -> next waiter granted in {(granted['at'] - killed) * 1000:.0f} ms")
    finally:
        client.close()
        cluster.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
