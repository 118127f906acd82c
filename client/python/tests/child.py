"""A worker process for the suite's process stories. Prints one line per
step (flushed) and runs until killed.

    child.py hold  sync|aio ENDPOINTS NAME TTL   take NAME, print "held FENCE", sleep
    child.py wait  sync|aio ENDPOINTS NAME TTL   print "waiting", wait for NAME, then as hold
    child.py pause sync|aio ENDPOINTS NAME TTL   as hold; after the first gap of over 1 s in
                                                 its 50 ms ticks (SIGSTOP), print "resumed
                                                 lost=BOOL valid=BOOL" from the first reads of
                                                 lock.lost and lock.valid, then "lost" once
                                                 lock.lost turns True
    child.py interrupt sync ENDPOINTS NAME TTL   open a session, print "session ID", wait for
                                                 NAME; on SIGINT print "interrupted" and sleep
"""

import asyncio
import signal
import sys
import time

# Ctrl-C raises KeyboardInterrupt here whatever this process inherited: a
# shell that runs a job in the background without job control (a CI
# script's `cmd &`) starts it with SIGINT ignored, and Python then keeps
# it ignored, so the "interrupt" story's child never saw its Ctrl-C.
signal.signal(signal.SIGINT, signal.default_int_handler)


def out(*words):
    print(*words, flush=True)


def run_sync(what, endpoints, name, ttl):
    import raftlock

    client = raftlock.Client(endpoints)
    if what == "interrupt":
        session = client.session(ttl=ttl)
        out("session", session.id)
        try:
            session.acquire(name)
            out("granted")
        except KeyboardInterrupt:
            out("interrupted")
        while True:
            time.sleep(1)
    if what == "wait":
        out("waiting")
    lock = client.lock(name, ttl=ttl)
    assert lock.acquire()
    out("held", lock.fence)
    prev = time.monotonic()
    while True:
        time.sleep(0.05)
        t = time.monotonic()
        if what == "pause" and t - prev > 1.0:
            out(f"resumed lost={lock.lost} valid={lock.valid} gap={t - prev:.2f}")
            what = "resumed"
        if what == "resumed" and lock.lost:
            out("lost")
            what = "hold"
        prev = t


async def run_aio(what, endpoints, name, ttl):
    import raftlock.aio

    client = raftlock.aio.Client(endpoints)
    if what == "wait":
        out("waiting")
    lock = client.lock(name, ttl=ttl)
    assert await lock.acquire()
    out("held", lock.fence)
    prev = time.monotonic()
    while True:
        await asyncio.sleep(0.05)
        t = time.monotonic()
        if what == "pause" and t - prev > 1.0:
            out(f"resumed lost={lock.lost} valid={lock.valid} gap={t - prev:.2f}")
            what = "resumed"
        if what == "resumed" and lock.lost:
            out("lost")
            what = "hold"
        prev = t


def main():
    what, api, endpoints, name, ttl = sys.argv[1:6]
    if api == "sync":
        run_sync(what, endpoints, name, float(ttl))
    else:
        asyncio.run(run_aio(what, endpoints, name, float(ttl)))


if __name__ == "__main__":
    main()
