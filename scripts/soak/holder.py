"""Lock holders of the Python client for scripts/soak-clients.sh.

    python holder.py sync|asyncio ENDPOINTS HOLDERS DURATION_S [PREFIX]

``sync``: HOLDERS threads share one ``raftlock.Client``; ``asyncio``:
HOLDERS tasks share one ``raftlock.aio.Client``. Both at the client's
defaults (ttl 10 s, grace 750 ms). Each holder takes a lock of its own and
holds it for DURATION_S seconds, reading ``lock.valid`` and ``lock.lost``
every 100 ms. A poll that finds the lock not valid (and not lost) starts a
jeopardy episode, the next that finds it valid ends it, so an episode is
timed to about a poll. Prints an event line on stderr as it happens and
one RESULT line per holder on stdout at the end.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time

import raftlock
import raftlock.aio

POLL = 0.1


def log(text: str) -> None:
    now = time.time()
    print(time.strftime("%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d} {text}", file=sys.stderr,
          flush=True)


class Tally:
    """What the polls of one holder saw."""

    def __init__(self, name: str, api: str) -> None:
        self.name, self.api = name, api
        self.lost = False
        self.on_lost = 0
        self.episodes = 0
        self.total = self.longest = 0.0
        self.since = None  # start of the jeopardy episode under way

    def observe(self, valid: bool, lost: bool) -> None:
        now = time.monotonic()
        if lost and not self.lost:
            self.lost = True
            self.end(now)
            log(f"{self.name} LOST")
        elif lost:
            pass
        elif not valid and self.since is None:
            self.since = now
            self.episodes += 1
            log(f"{self.name} jeopardy")
        elif valid and self.since is not None:
            log(f"{self.name} held again after {self.end(now):.3f} s")

    def end(self, now: float) -> float:
        if self.since is None:
            return 0.0
        d = now - self.since
        self.total += d
        self.longest = max(self.longest, d)
        self.since = None
        return d

    def result(self, held: bool, error: str = "") -> str:
        return (f"RESULT client=python-{self.api} name={self.name} lost={int(self.lost)} on_lost={self.on_lost} "
                f"jeopardy={self.episodes} jeopardy_total={self.total:.3f} jeopardy_longest={self.longest:.3f} "
                f"held_at_end={int(held)} error={error!r}")


def hold_sync(client: raftlock.Client, t: Tally, duration: float, results: dict) -> None:
    try:
        lock = client.lock(t.name, timeout=60)
        if not lock.acquire():
            results[t.name] = t.result(False, "not acquired within 60 s")
            return
        end = time.monotonic() + duration
        while time.monotonic() < end:
            time.sleep(POLL)
            t.observe(lock.valid, lock.lost)
        # Held at the end: valid by the client's count (a jeopardy episode
        # under way may end within 5 s) and the fence current on the cluster.
        wait = time.monotonic() + 5
        while t.since is not None and not t.lost and time.monotonic() < wait:
            time.sleep(POLL)
            t.observe(lock.valid, lock.lost)
        valid, lost = lock.valid, lock.lost
        t.observe(valid, lost)
        t.end(time.monotonic())
        current = client.check_fence(t.name, lock.fence)
        lock.release()
        results[t.name] = t.result(valid and not lost and current, "" if current else "fence not current")
    except Exception as e:  # noqa: BLE001 - reported in the RESULT line
        t.end(time.monotonic())
        results[t.name] = t.result(False, f"{type(e).__name__}: {e}")


async def hold_aio(client: raftlock.aio.Client, t: Tally, duration: float, results: dict) -> None:
    try:
        lock = client.lock(t.name, timeout=60)
        if not await lock.acquire():
            results[t.name] = t.result(False, "not acquired within 60 s")
            return
        end = time.monotonic() + duration
        while time.monotonic() < end:
            await asyncio.sleep(POLL)
            t.observe(lock.valid, lock.lost)
        wait = time.monotonic() + 5
        while t.since is not None and not t.lost and time.monotonic() < wait:
            await asyncio.sleep(POLL)
            t.observe(lock.valid, lock.lost)
        valid, lost = lock.valid, lock.lost
        t.observe(valid, lost)
        t.end(time.monotonic())
        current = await client.check_fence(t.name, lock.fence)
        await lock.release()
        results[t.name] = t.result(valid and not lost and current, "" if current else "fence not current")
    except Exception as e:  # noqa: BLE001 - reported in the RESULT line
        t.end(time.monotonic())
        results[t.name] = t.result(False, f"{type(e).__name__}: {e}")


def main() -> None:
    api, endpoints, holders, duration = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    prefix = sys.argv[5] if len(sys.argv) > 5 else f"soak/python-{api}/"
    tallies = {f"{prefix}{i}": Tally(f"{prefix}{i}", api) for i in range(holders)}
    results: dict = {}

    def on_lost(name: str, fence: int) -> None:
        log(f"{name} on_lost (fence {fence})")
        tallies[name].on_lost += 1

    if api == "sync":
        client = raftlock.Client(endpoints, on_lost=on_lost)
        threads = [threading.Thread(target=hold_sync, args=(client, t, duration, results)) for t in tallies.values()]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        client.close()
    elif api == "asyncio":
        async def run() -> None:
            async with raftlock.aio.Client(endpoints, on_lost=on_lost) as client:
                await asyncio.gather(*(hold_aio(client, t, duration, results) for t in tallies.values()))

        asyncio.run(run())
    else:
        sys.exit(f"unknown API {api!r}: sync or asyncio")
    for name in tallies:
        print(results.get(name, tallies[name].result(False, "no result")), flush=True)


if __name__ == "__main__":
    main()
