"""The scenarios every first-party client runs: ``client/scenarios.json``,
read as ``client/scenarios.md`` says, with the sync client
(``raftlock.Client``) against three ``raftlockd run`` processes (so that
``kill_leader`` can SIGKILL one node alone).

The runner is data only: each step is looked up by its ``op``, its fields
are checked against what that op takes, and an unknown op, field or
``expect`` fails the scenario. One test per scenario, in the file's order,
all on one cluster (the leader-failover scenario, last in the file, kills a
node of it). A scenario fails on its first step whose outcome differs,
naming the scenario, the step (its index and its JSON) and what it got.

How the steps map onto this client:

* An actor is one ``raftlock.Client`` (with ``on_lost`` recording every
  lost-lock notice) and one session of it (``ttl_ms`` from the actor, else
  the client's default), opened at the actor's first ``lock``.
* ``start_lock`` needs a wait that its caller can give up from outside,
  and the sync client has no way to give up one wait from another thread
  (a blocking ``acquire`` ends with its outcome, its timeout, or Ctrl-C in
  the main thread; closing the whole session withdraws every wait of it,
  but gives up its grants too). So a background lock is taken with
  ``raftlock.aio``, in an event loop of the runner's, in the actor's
  asyncio session (a ``raftlock.aio.Client`` of the actor's, opened at its
  first ``start_lock``), and ``cancel`` cancels that task, as an asyncio
  caller gives a wait up. Sessions open at an actor's first lock, so an
  actor that only locks in the background (every such actor of the file)
  still has one session.
* Every blocking call runs under a bound (its ``max_elapsed_ms``, else
  30 s past its timeout): a call that hangs fails the step.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from pathlib import Path

import pytest

import raftlock
import raftlock.aio

from conftest import RunCluster, revoke_session

SCENARIOS_FILE = Path(__file__).resolve().parents[2] / "scenarios.json"
#: How long a blocking call may take beyond its own timeout before the step fails.
SAFETY = 30.0
#: How long ``describe`` polls for the counts it expects (scenarios.md).
DESCRIBE_FOR = 10.0
POLL = 0.05

OUTCOMES = {"granted", "not_acquired", "cancelled", "invalid_argument", "unreachable", "released"}
LOCK_FIELDS = {"actor", "name", "mode", "capacity", "weight", "timeout_ms"}
#: Each op: the fields it requires and those it may have (besides ``op``).
OPS = {
    "lock": ({"actor", "name", "expect"},
             LOCK_FIELDS | {"as", "expect", "fence_above", "min_elapsed_ms", "max_elapsed_ms", "message_contains"}),
    "start_lock": ({"actor", "name", "as"}, LOCK_FIELDS | {"as"}),
    "finish": ({"grant", "expect", "within_ms"}, {"grant", "expect", "within_ms", "fence_above", "message_contains"}),
    "cancel": ({"grant"}, {"grant"}),
    "release": ({"grant", "expect"}, {"grant", "expect"}),
    "describe": ({"name", "holders", "waiters"}, {"name", "holders", "waiters"}),
    "check_fence": ({"grant", "expect"}, {"grant", "expect"}),
    "check_held": ({"grant", "expect"}, {"grant", "expect"}),
    "revoke": ({"grant"}, {"grant"}),
    "expect_lost": ({"grant", "within_ms"}, {"grant", "within_ms"}),
    "kill_leader": (set(), set()),
}


def load():
    with open(SCENARIOS_FILE, encoding="utf-8") as f:
        return json.load(f)["scenarios"]


SCENARIOS = load()


class StepFailed(AssertionError):
    pass


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    c = RunCluster(tmp_path_factory.mktemp("scenarios"))
    try:
        c.wait_ready()
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def loop():
    """An event loop in a thread of its own, for the background waits."""
    lp = asyncio.new_event_loop()
    t = threading.Thread(target=lp.run_forever, name="scenarios-asyncio", daemon=True)
    t.start()
    yield lp
    lp.call_soon_threadsafe(lp.stop)
    t.join(10)


def bounded(fn, bound: float):
    """Runs ``fn()`` in a thread: ``(done, value, error, elapsed)``; done is
    False if it was still running after ``bound`` seconds."""
    box = {}

    def run():
        start = time.monotonic()
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - the step judges it
            box["error"] = e
        box["elapsed"] = time.monotonic() - start

    t = threading.Thread(target=run, name="scenario-call", daemon=True)
    t.start()
    t.join(bound)
    if t.is_alive():
        return False, None, None, bound
    return True, box.get("value"), box.get("error"), box["elapsed"]


def outcome_of(error: BaseException) -> str:
    """The scenario outcome an error is (or a description of it, which no
    ``expect`` equals)."""
    if isinstance(error, raftlock.NotAcquired):
        return "not_acquired"
    if isinstance(error, raftlock.InvalidArgument):
        return "invalid_argument"
    if isinstance(error, raftlock.Unreachable):
        return "unreachable"
    if isinstance(error, asyncio.CancelledError):
        return "cancelled"
    return f"{type(error).__name__}: {error}"


class Actor:
    def __init__(self, runner: "Runner", key: str, spec: dict) -> None:
        if not isinstance(spec, dict) or set(spec) - {"ttl_ms", "endpoints"}:
            runner.fail(f"actor {key!r}: takes ttl_ms and endpoints, got {spec!r}")
        self.key = key
        self.runner = runner
        self.endpoints = spec.get("endpoints", runner.nodes.addrs)
        self.ttl = {"ttl": spec["ttl_ms"] / 1000.0} if "ttl_ms" in spec else {}
        self.cond = threading.Condition()
        self.lost = []  # (name, fence) of every lost-lock notice
        self.client = raftlock.Client(self.endpoints, on_lost=self.on_lost)
        self.session = None
        self.aio_client = None
        self.aio_session = None

    def on_lost(self, name: str, fence: int) -> None:
        with self.cond:
            self.lost.append((name, fence))
            self.cond.notify_all()

    def sync_session(self) -> raftlock.Session:
        if self.session is None:
            self.session = self.client.session(**self.ttl)
        return self.session

    async def async_session(self) -> raftlock.aio.Session:
        # Only the loop's thread runs this: no two opens race.
        if self.aio_client is None:
            self.aio_client = raftlock.aio.Client(self.endpoints, on_lost=self.on_lost)
        if self.aio_session is None:
            self.aio_session = await self.aio_client.session(**self.ttl)
        return self.aio_session

    def close(self) -> None:
        async def close_aio():
            if self.aio_session is not None:
                await self.aio_session.close()
            await self.aio_client.close()

        if self.aio_client is not None:
            fut = asyncio.run_coroutine_threadsafe(close_aio(), self.runner.loop)
            bounded(lambda: fut.result(SAFETY), SAFETY + 1)
        if self.session is not None:
            bounded(self.session.close, SAFETY)
        self.client.close()


class Grant:
    """A granted lock of an actor (a sync or an asyncio ``Lock``)."""

    def __init__(self, actor: Actor, lock, loop=None) -> None:
        self.actor = actor
        self.lock = lock
        self.loop = loop  # set for an asyncio Lock

    @property
    def name(self) -> str:
        return self.lock.name

    @property
    def fence(self) -> int:
        return self.lock.fence

    @property
    def session_id(self) -> int:
        return self.lock.session.id

    def release(self) -> bool:
        if self.loop is None:
            return self.lock.release()
        return asyncio.run_coroutine_threadsafe(self.lock.release(), self.loop).result(SAFETY)

    def believed_held(self) -> bool:
        return self.lock.held and not self.lock.lost

    def __repr__(self) -> str:
        return f"granted (fence {self.fence})"


class Background:
    """A ``start_lock``: the actor's asyncio session acquiring in a task."""

    def __init__(self, actor: Actor, name: str, kwargs: dict, loop) -> None:
        self.actor = actor
        self.loop = loop
        self.done = threading.Event()
        self.lock = None
        self.error = None

        async def run():
            try:
                session = await actor.async_session()
                self.lock = await session.acquire(name, **kwargs)
            except BaseException as e:  # noqa: BLE001 - finish judges it (CancelledError too)
                self.error = e
            finally:
                self.done.set()

        async def start():
            return asyncio.get_running_loop().create_task(run())

        self.task = asyncio.run_coroutine_threadsafe(start(), loop).result(SAFETY)

    def cancel(self) -> None:
        self.loop.call_soon_threadsafe(self.task.cancel)


class Runner:
    def __init__(self, scenario: dict, nodes: RunCluster, loop) -> None:
        self.scenario = scenario
        self.nodes = nodes
        self.loop = loop
        self.actors = {}
        self.grants = {}  # "as" -> Grant, or Background until finished
        self.observer = None
        self.index = None
        self.step = None

    # ------------------------------------------------------------ running

    def run(self) -> None:
        s = self.scenario
        unknown = set(s) - {"name", "actors", "steps"}
        if unknown:
            self.fail(f"unknown fields {sorted(unknown)}")
        try:
            self.observer = raftlock.Client(self.nodes.addrs)
            for key, spec in s["actors"].items():
                self.actors[key] = Actor(self, key, spec)
            for self.index, self.step in enumerate(s["steps"]):
                op = self.step.get("op")
                if op not in OPS:
                    self.fail(f"unknown op {op!r}")
                required, allowed = OPS[op]
                fields = set(self.step) - {"op"}
                if fields - allowed or required - fields:
                    self.fail(f"op {op!r} takes {sorted(allowed)} and needs {sorted(required)}; "
                              f"got {sorted(fields)}")
                getattr(self, "op_" + op)(self.step)
        finally:
            self.close()

    def fail(self, what: str):
        where = f"scenario {self.scenario.get('name')!r}"
        if self.step is not None:
            where += f", step {self.index} {json.dumps(self.step)}"
        raise StepFailed(f"{where}: {what}")

    def close(self) -> None:
        for g in self.grants.values():
            if isinstance(g, Background) and not g.done.is_set():
                g.cancel()
        for a in self.actors.values():
            try:
                a.close()
            except Exception:  # noqa: BLE001 - their leases end them
                pass
        if self.observer is not None:
            self.observer.close()

    # ------------------------------------------------------------ reading

    def actor(self, key) -> Actor:
        if key not in self.actors:
            self.fail(f"no actor {key!r}")
        return self.actors[key]

    def grant(self, key) -> Grant:
        g = self.grants.get(key)
        if g is None:
            self.fail(f"no grant {key!r} (not granted, or never named)")
        if isinstance(g, Background):
            self.fail(f"grant {key!r} was started in the background and not finished as granted")
        return g

    def lock_name(self, name) -> str:
        if isinstance(name, str):
            return name
        if isinstance(name, dict) and set(name) == {"repeat", "times"}:
            return name["repeat"] * name["times"]
        self.fail(f"a name is a string or {{repeat, times}}, got {name!r}")

    def acquire_args(self, step) -> dict:
        mode = step.get("mode", "exclusive")
        if mode not in ("exclusive", "shared"):
            self.fail(f"unknown mode {mode!r}")
        kwargs = {"shared": mode == "shared"}
        if "capacity" in step:
            kwargs["capacity"] = step["capacity"]
        if "weight" in step:
            kwargs["weight"] = step["weight"]
        ms = step.get("timeout_ms")
        kwargs["timeout"] = None if ms is None else ms / 1000.0
        return kwargs

    def expect(self, step, allowed):
        want = step["expect"]
        if want not in allowed:
            self.fail(f"unknown expect {want!r} for this op (known: {sorted(allowed)})")
        return want

    def judge(self, step, got, error) -> None:
        """Compares an acquire's outcome (a Grant, or the error) with the
        step's ``expect``, ``message_contains`` and ``fence_above``."""
        want = self.expect(step, OUTCOMES - {"released"})
        outcome = "granted" if error is None else outcome_of(error)
        shown = repr(got) if error is None else f"{outcome} ({type(error).__name__}: {error})"
        if outcome != want:
            self.fail(f"expected {want}, got {shown}")
        if "message_contains" in step:
            if error is None or step["message_contains"] not in str(error):
                self.fail(f"expected a message containing {step['message_contains']!r}, got {shown}")
        if "fence_above" in step:
            other = self.grant(step["fence_above"])
            if got is None:
                self.fail(f"fence_above needs a grant, got {shown}")
            if not got.fence > other.fence:
                self.fail(f"fence {got.fence} is not above {step['fence_above']}'s fence {other.fence}")

    # -------------------------------------------------------------- ops

    def op_lock(self, step) -> None:
        actor = self.actor(step["actor"])
        name = self.lock_name(step["name"])
        kwargs = self.acquire_args(step)
        self.expect(step, OUTCOMES - {"released"})
        if "max_elapsed_ms" in step:
            bound = step["max_elapsed_ms"] / 1000.0 + 0.5
        else:
            bound = SAFETY + (kwargs["timeout"] or 0.0)
        done, lock, error, elapsed = bounded(lambda: actor.sync_session().acquire(name, **kwargs), bound)
        if not done:
            self.fail(f"still running after {bound:.1f} s")
        got = Grant(actor, lock) if error is None else None
        self.judge(step, got, error)
        if "min_elapsed_ms" in step and elapsed * 1000 < step["min_elapsed_ms"]:
            self.fail(f"took {elapsed * 1000:.0f} ms, less than min_elapsed_ms")
        if "max_elapsed_ms" in step and elapsed * 1000 > step["max_elapsed_ms"]:
            self.fail(f"took {elapsed * 1000:.0f} ms, more than max_elapsed_ms")
        if got is not None and "as" in step:
            self.grants[step["as"]] = got

    def op_start_lock(self, step) -> None:
        actor = self.actor(step["actor"])
        name = self.lock_name(step["name"])
        if step["as"] in self.grants:
            self.fail(f"grant {step['as']!r} is named twice")
        self.grants[step["as"]] = Background(actor, name, self.acquire_args(step), self.loop)

    def background(self, key) -> Background:
        g = self.grants.get(key)
        if not isinstance(g, Background):
            self.fail(f"{key!r} is not a lock started in the background")
        return g

    def op_cancel(self, step) -> None:
        self.background(step["grant"]).cancel()

    def op_finish(self, step) -> None:
        key = step["grant"]
        bg = self.background(key)
        self.expect(step, OUTCOMES - {"released"})
        if not bg.done.wait(step["within_ms"] / 1000.0):
            self.fail(f"no outcome within {step['within_ms']} ms")
        got = Grant(bg.actor, bg.lock, self.loop) if bg.error is None else None
        self.judge(step, got, bg.error)
        if got is not None:
            self.grants[key] = got
        else:
            del self.grants[key]

    def op_release(self, step) -> None:
        self.expect(step, {"released"})
        g = self.grant(step["grant"])
        done, released, error, _ = bounded(g.release, SAFETY)
        if not done:
            self.fail(f"still running after {SAFETY:.0f} s")
        if error is not None:
            self.fail(f"expected released, got {type(error).__name__}: {error}")
        if released is not True:
            self.fail(f"expected released, got release() == {released!r}")

    def op_describe(self, step) -> None:
        name = self.lock_name(step["name"])
        want = (step["holders"], step["waiters"])
        deadline = time.monotonic() + DESCRIBE_FOR
        while True:
            done, info, error, _ = bounded(lambda: self.observer.describe(name), SAFETY)
            if not done or error is not None:
                self.fail(f"describe failed: {'still running' if not done else repr(error)}")
            got = (0, 0) if info is None else (len(info.holders), len(info.waiters))
            if got == want:
                return
            if time.monotonic() >= deadline:
                self.fail(f"after {DESCRIBE_FOR:.0f} s still {got[0]} holders and {got[1]} waiters ({info})")
            time.sleep(POLL)

    def boolean(self, step) -> bool:
        want = step["expect"]
        if not isinstance(want, bool):
            self.fail(f"unknown expect {want!r} for this op (true or false)")
        return want

    def op_check_fence(self, step) -> None:
        want = self.boolean(step)
        g = self.grant(step["grant"])
        done, current, error, _ = bounded(lambda: g.actor.client.check_fence(g.name, g.fence), SAFETY)
        if not done or error is not None:
            self.fail(f"check_fence failed: {'still running' if not done else repr(error)}")
        if current is not want:
            self.fail(f"expected check_fence {want}, got {current}")

    def op_check_held(self, step) -> None:
        want = self.boolean(step)
        g = self.grant(step["grant"])
        held, lost = g.lock.held, g.lock.lost
        if (held and not lost) is not want:
            self.fail(f"expected held-and-not-lost {want}, got held={held} lost={lost}")

    def op_expect_lost(self, step) -> None:
        g = self.grant(step["grant"])
        actor, key = g.actor, (g.name, g.fence)
        with actor.cond:
            if not actor.cond.wait_for(lambda: key in actor.lost, step["within_ms"] / 1000.0):
                self.fail(f"no lost-lock notice for {key} within {step['within_ms']} ms (notices: {actor.lost})")

    def alive(self):
        return [a for a, p in self.nodes.procs.items() if p.poll() is None]

    def leader(self) -> str:
        deadline = time.monotonic() + SAFETY
        while True:
            leader = self.nodes.leader(self.alive())
            if leader:
                return leader
            if time.monotonic() >= deadline:
                self.fail(f"no leader among {self.alive()} within {SAFETY:.0f} s")
            time.sleep(POLL)

    def op_revoke(self, step) -> None:
        g = self.grant(step["grant"])
        try:
            revoke_session(self.leader, g.session_id, within=SAFETY)
        except AssertionError as e:
            self.fail(str(e))

    def op_kill_leader(self, step) -> None:
        leader = self.leader()
        proc = self.nodes.procs[leader]
        proc.send_signal(signal.SIGKILL)
        proc.wait()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s["name"] for s in SCENARIOS])
def test_scenario(scenario, nodes, loop):
    Runner(scenario, nodes, loop).run()
