"""The chaos run: servers, workers and producers of four targets, a timeline of faults, and the check at the end.

Every server is private (free ports, temporary directories) and stopped when the run ends, also on Ctrl-C or
SIGTERM. Worker and producer processes run in process groups of their own; a kill is ``killpg(SIGKILL)`` of a
worker's group, which takes its promoter thread with it, and a new worker is started at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

from delay_broker import DelayStore

from ..ha_servers import SentinelSet, StandaloneServer, install_handlers
from ..servers import AWS_TEST_ENV, MotoServer, RabbitNode
from .check import Kill, LaneFigures, Outage, check_lane
from .common import (
    ENV_BATCH,
    ENV_BROKER,
    ENV_BROKER_URL,
    ENV_LANE,
    ENV_LEASE,
    ENV_ONCE,
    ENV_RESULTS_URL,
    ENV_RUN,
    ENV_STORE_URL,
    Run,
    namespace,
    now_ms,
    ran_key,
    sent_key,
)

ROOT = Path(__file__).resolve().parents[2]
AOF = ["--appendonly", "yes", "--appendfsync", "everysec"]
"""A process crash loses nothing with ``everysec``: Redis has written each command to the file (the kernel holds
it) before it replies. See docs/reliability.md for what a machine crash would add."""


@dataclass(frozen=True)
class Lane:
    """One target: a framework on a broker, with the share of the run's messages it carries."""

    name: str
    framework: str
    broker: str
    exactly_once: bool
    share: float
    workers: int
    threads: int
    batch: int
    lease: float
    prefix: str


LANES = (
    Lane("dramatiq-redis", "dramatiq", "redis", True, 0.70, 2, 4, 200, 30.0, "dr"),
    Lane("celery-redis", "celery", "redis", True, 0.16, 2, 4, 200, 30.0, "cr"),
    Lane("dramatiq-rabbitmq", "dramatiq", "rabbitmq", False, 0.12, 2, 8, 50, 15.0, "rq"),
    Lane("dramatiq-sqs", "dramatiq", "sqs", False, 0.02, 2, 8, 20, 15.0, "sq"),
)


@dataclass(frozen=True)
class Scale:
    messages: int
    produce_s: float
    """Producers send evenly over this long."""
    min_delay_s: float
    max_delay_s: float
    kills: int
    redis_restarts: int
    rabbit_restarts: int
    failovers: int
    drain_s: float
    """After the last due time, how long the run waits for every message to run."""
    quiet_s: float
    """After every message ran, how long the run waits for a late duplicate."""


START_ATTEMPTS = 3
"""Starts of a restarted server before the run gives up."""

SCALES = {
    # 3,000,000 messages sent over 60 min (833 a second: what 2 cores sustain with every fault on), delayed up to
    # 16 min (past SQS's 15-minute cap).
    "full": Scale(3_000_000, 3600.0, 5.0, 960.0, 330, 3, 2, 4, 600.0, 60.0),
    # A tenth of the full run, in about a quarter of its time: what this machine sustains with every fault on.
    "tenth": Scale(300_000, 600.0, 5.0, 300.0, 60, 1, 1, 1, 600.0, 60.0),
    "ci": Scale(12_000, 40.0, 3.0, 30.0, 24, 1, 1, 1, 240.0, 20.0),
}


def group_pids(leader: int) -> frozenset[int]:
    """Every process of the process group ``leader`` leads (a Dramatiq worker's children too)."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                fields = stat[stat.rindex(")") + 2 :].split()
                if int(fields[2]) == leader:
                    pids.add(int(entry.name))
    return frozenset(pids)


def kill_group(process: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


@dataclass
class Worker:
    lane: Lane
    process: subprocess.Popen[bytes]


class RunsReader:
    """Reads a list of records in the results Redis as it grows, so the end of the run reads only the rest."""

    def __init__(self, client: redis.Redis, key: str) -> None:
        self.client, self.key = client, key
        self.lines: list[bytes] = []
        self.ids: set[bytes] = set()
        """The distinct ids read so far (each record starts with its id)."""

    def poll(self, chunk: int = 200_000) -> None:
        while True:
            more = self.client.lrange(self.key, len(self.lines), len(self.lines) + chunk - 1)
            self.lines.extend(more)
            self.ids.update(line.split(b" ", 1)[0] for line in more)
            if len(more) < chunk:
                return


@dataclass
class Report:
    scale: str
    seed: int
    wall_s: float
    machine: dict[str, Any]
    targets: list[dict[str, Any]]
    events: dict[str, Any] = field(default_factory=dict)
    once: bool = True
    timeline: dict[str, Any] = field(default_factory=dict)
    """When the run began (``origin_ms``), its kills and its outages: what a duplicate's runs are read against."""

    @property
    def ok(self) -> bool:
        return all(target["ok"] for target in self.targets)

    def lines(self) -> Iterator[str]:
        machine = self.machine["summary"]
        once = "effectively once on the at-least-once lanes" if self.once else "without effectively-once"
        yield f"chaos run --scale {self.scale} (seed {self.seed}, {once}): wall {self.wall_s:.0f} s on {machine}"
        for t in self.targets:
            late = t["lateness_ms"]
            causes = ", ".join(f"{cause} {n}" for cause, n in t["by_cause"].items()) or "none"
            yield (
                f"{t['target']:<18} {t['guarantee']:<13} messages={t['messages']} kills={t['kills']} "
                f"restarts={t['restarts']} failovers={t['failovers']} lost={t['lost']} "
                f"(after hand-off {t['lost_after_handoff']}) duplicated={t['duplicated']} "
                f"(bound {t['duplicate_bound']}) dropped={t['dropped']} reruns={t['reruns']} [{causes}] "
                f"early={t['early']} "
                f"lateness_ms p50={late['p50']} p99={late['p99']} max={late['max']} {'ok' if t['ok'] else 'FAILED'}"
            )
        yield "totals: " + " ".join(f"{key}={value}" for key, value in self.events.items())
        for t in self.targets:
            if not t["ok"]:
                yield from self.duplicate_lines(t)

    def duplicate_lines(self, target: dict[str, Any]) -> Iterator[str]:
        """A failed target's duplicates, each run against the lane's kills and outages (seconds into the run)."""

        def at(ms: int) -> str:
            return f"{(ms - self.timeline.get('origin_ms', 0)) / 1000:.1f}"

        lane = target["target"]
        kills = [kill["at_ms"] for kill in self.timeline.get("kills", []) if kill["lane"] == lane]
        outages = [o for o in self.timeline.get("outages", []) if lane in o["lanes"]]
        yield f"{lane} kills at s: {', '.join(at(ms) for ms in kills) or 'none'}; outages: " + (
            ", ".join(f"{o['kind']} {at(o['start_ms'])}-{at(o['end_ms'])} s" for o in outages) or "none"
        )
        for id, runs in target["duplicate_runs"].items():
            yield f"{lane} ran {id} at s: " + ", ".join(f"{at(ms)} (pid {pid})" for ms, pid in runs)


class ChaosRun:
    """One run. ``once``: the at-least-once lanes' workers run effectively once (OnceMiddleware); without it they
    run every delivery, as the figures published before effectively-once execution existed."""

    def __init__(self, scale: str, seed: int | None = None, logs: Path | None = None, *, once: bool = True) -> None:
        self.scale_name, self.scale = scale, SCALES[scale]
        self.once = once
        self.seed = seed if seed is not None else random.SystemRandom().randrange(2**32)
        self.rng = random.Random(self.seed)
        self.run_id = uuid.uuid4().hex[:8]
        self.logs = logs or Path(tempfile.mkdtemp(prefix="delay-broker-chaos-"))
        self.servers: list[Any] = []
        self.workers: list[Worker] = []
        self.producers: dict[str, subprocess.Popen[bytes]] = {}
        self.kills: list[Kill] = []
        self.outages: list[Outage] = []
        self.origin_ms = now_ms()
        self.spawned = self.exited = 0
        self.stores: dict[str, DelayStore] = {}
        self.lock = threading.Lock()  # the workers list: the kill thread and the main thread both change it
        self.finished = threading.Event()

    # -- servers -------------------------------------------------------------------------------------------------

    def start_servers(self) -> None:
        install_handlers()  # SIGTERM unwinds like Ctrl-C, so every server below is stopped
        self.results = self._own(StandaloneServer("results"))
        self.redis = self._own(StandaloneServer("redis (AOF)", AOF))
        self.sentinel = self._own(SentinelSet(appendonly=True))
        self.sentinel.start()
        self.rabbit = self._own(RabbitNode())
        self.rabbit.start()
        self.moto = self._own(MotoServer())
        self.moto.start()
        self.results_client = self.results.client()

    def _own(self, server: Any) -> Any:
        self.servers.append(server)
        return server

    def lane_env(self, lane: Lane) -> dict[str, str]:
        urls = {"redis": self.redis.url, "rabbitmq": self.rabbit.pika_url, "sqs": self.moto.endpoint_url}
        return {
            **os.environ,
            **AWS_TEST_ENV,
            "PYTHONPATH": str(ROOT),
            ENV_RUN: self.run_id,
            ENV_LANE: lane.name,
            ENV_BROKER: lane.broker,
            ENV_BROKER_URL: urls[lane.broker],
            ENV_STORE_URL: "" if lane.exactly_once else self.sentinel.url,
            ENV_RESULTS_URL: self.results.url,
            ENV_LEASE: str(lane.lease),
            ENV_BATCH: str(lane.batch),
            ENV_ONCE: "1" if self.once_on(lane) else "",
        }

    def once_on(self, lane: Lane) -> bool:
        """Effectively-once execution is for the at-least-once lanes (the others hand off exactly once)."""
        return self.once and not lane.exactly_once

    def store_of(self, lane: Lane) -> DelayStore:
        if lane.name not in self.stores:
            url = self.redis.url if lane.exactly_once else self.sentinel.url
            space = namespace(self.lane_env(lane))
            self.stores[lane.name] = DelayStore.from_url(url, namespace=space, socket_timeout=5)
        return self.stores[lane.name]

    # -- processes -----------------------------------------------------------------------------------------------

    def spawn_worker(self, lane: Lane) -> None:
        if lane.framework == "dramatiq":
            command = ["-m", "dramatiq", "integration.chaos.dramatiq_app", "--processes", "1"]
            command += ["--threads", str(lane.threads)]
        else:
            command = ["-m", "celery", "-A", "integration.chaos.celery_app", "worker", "--pool", "threads"]
            command += ["-c", str(lane.threads), "-l", "WARNING", "-n", f"{lane.name}-{self.spawned}@%h"]
            command += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
        with open(self.logs / f"{lane.name}.log", "ab") as log:
            process = subprocess.Popen(
                [sys.executable, *command],
                cwd=ROOT,
                env=self.lane_env(lane),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.workers.append(Worker(lane, process))
        self.spawned += 1

    def start_producers(self) -> None:
        scale = self.scale
        for lane in LANES:
            count = round(scale.messages * lane.share)
            arguments = [lane.framework, count, scale.produce_s, scale.min_delay_s, scale.max_delay_s]
            arguments += [self.rng.randrange(2**32), f"{lane.prefix}-"]
            with open(self.logs / f"{lane.name}.producer.log", "ab") as log:
                process = subprocess.Popen(
                    [sys.executable, "-m", "integration.chaos.producer", *map(str, arguments)],
                    cwd=ROOT,
                    env=self.lane_env(lane),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    start_new_session=True,
                )
            self.producers[lane.name] = process
        for name, process in self.producers.items():
            assert process.stdout is not None
            line = process.stdout.readline().strip()
            if line != b"ready":
                raise RuntimeError(f"producer of {name} did not start (see {self.logs}/{name}.producer.log)")

    def replace_exited_workers(self) -> None:
        """A worker may exit by itself (its broker was down when it booted): start another."""
        with self.lock:
            for worker in list(self.workers):
                if worker.process.poll() is not None:
                    self.workers.remove(worker)
                    self.exited += 1
                    self.spawn_worker(worker.lane)

    # -- faults --------------------------------------------------------------------------------------------------

    def kill_worker(self, rng: random.Random) -> None:
        with self.lock:
            worker = self.workers.pop(rng.randrange(len(self.workers)))
            pids = group_pids(worker.process.pid) | {worker.process.pid}
            at = now_ms()
            kill_group(worker.process, signal.SIGKILL)
            worker.process.wait(10)
            self.spawn_worker(worker.lane)
        leased = frozenset() if worker.lane.exactly_once else self.leased(worker.lane)
        self.kills.append(Kill(worker.lane.name, at, pids, leased))

    def kill_at(self, moments: list[float], t0: float, rng: random.Random) -> None:
        """The kill thread: a worker SIGKILLed at each moment (seconds after ``t0``), whatever else goes on."""
        for at in moments:
            if self.finished.wait(max(0.0, t0 + at - time.monotonic())):
                return
            self.kill_worker(rng)

    def leased(self, lane: Lane) -> frozenset[str]:
        """Ids any promoter of ``lane`` holds under a lease now: those a promoter kill may deliver twice."""
        store = self.store_of(lane)
        for _ in range(20):  # the store may be failing over
            with contextlib.suppress(redis.RedisError, OSError):
                members = [store.client.zrange(space.inflight, 0, -1) for space in store.shards]
                return frozenset(member.decode() for group in members for member in group)
            time.sleep(0.5)
        raise RuntimeError(f"could not read the leases of {lane.name}")

    def restart_redis(self) -> None:
        self.restart("redis-server", "redis", self.redis.crash, self.redis.restart)

    def restart_rabbit(self) -> None:
        self.restart("rabbitmq-server", "rabbitmq", self.rabbit.stop, self.rabbit.start)

    def restart(self, server: str, broker: str, stop: Callable[[], object], start: Callable[[], object]) -> None:
        """Stop ``server``, start it again 1-3 s later; an outage of every lane on ``broker``.

        A start that fails is tried again: once in a dozen restarts or so, rabbitmq-server exits at once when started
        right after it stopped. An hour-long run must not end on that.
        """
        began = now_ms()
        stop()
        time.sleep(self.rng.uniform(1.0, 3.0))
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                start()
                break
            except RuntimeError as error:
                if attempt == START_ATTEMPTS:
                    raise
                self.log(f"{server} did not start ({error}); trying again in 5 s")
                time.sleep(5.0)
        lanes = frozenset(lane.name for lane in LANES if lane.broker == broker)
        self.outages.append(Outage("restart", server, lanes, began, now_ms()))

    def fail_over(self) -> None:
        start = now_ms()
        self.sentinel.failover(timeout=60.0)
        lanes = frozenset(lane.name for lane in LANES if not lane.exactly_once)
        self.outages.append(Outage("failover", "sentinel", lanes, start, now_ms()))

    @property
    def window(self) -> float:
        """Faults happen in the first this many seconds; the last dues leave time to recover from them."""
        return self.scale.produce_s + 0.85 * self.scale.max_delay_s

    def kill_moments(self) -> list[float]:
        return sorted(self.rng.uniform(2.0, self.window) for _ in range(self.scale.kills))

    def timeline(self) -> list[tuple[float, str]]:
        """(seconds after the start, fault) of the restarts and failovers, spread evenly."""
        scale, window = self.scale, self.window
        events: list[tuple[float, str]] = []
        for count, fault, offset in (
            (scale.redis_restarts, "restart_redis", 0.0),
            (scale.rabbit_restarts, "restart_rabbit", 0.33),
            (scale.failovers, "fail_over", 0.66),
        ):
            step = window / (count + 1)
            events += [(step * (n + 1) + offset * step * 0.5, fault) for n in range(count)]
        return sorted(events)

    # -- the run ---------------------------------------------------------------------------------------------------

    def execute(self) -> Report:
        started = time.monotonic()
        try:
            self.start_servers()
            for lane in LANES:
                for _ in range(lane.workers):
                    self.spawn_worker(lane)
            readers = {
                lane.name: (
                    RunsReader(self.results_client, sent_key(self.run_id, lane.name)),
                    RunsReader(self.results_client, ran_key(self.run_id, lane.name)),
                )
                for lane in LANES
            }
            t0, self.origin_ms = time.monotonic(), now_ms()
            self.start_producers()
            killer = threading.Thread(
                target=self.kill_at, args=(self.kill_moments(), t0, random.Random(self.rng.random())), daemon=True
            )
            killer.start()
            for at, fault in self.timeline():
                while time.monotonic() - t0 < at:
                    self.replace_exited_workers()
                    time.sleep(min(0.5, max(0.0, at - (time.monotonic() - t0))))
                getattr(self, fault)()
                self.log(f"{time.monotonic() - t0:7.1f} s {fault}, {len(self.kills)} kills so far")
            killer.join()
            summaries = self.wait_for_producers()
            self.drain(readers, t0)
            figures = self.check(readers)
        finally:
            self.finished.set()
            self.stop()
        return self.report(figures, summaries, time.monotonic() - started)

    def wait_for_producers(self) -> dict[str, Any]:
        summaries = {}
        for name, process in self.producers.items():
            assert process.stdout is not None
            while process.poll() is None:
                self.replace_exited_workers()
                time.sleep(1.0)
            lines = process.stdout.read().decode().strip().splitlines()
            if process.returncode != 0 or not lines:
                raise RuntimeError(f"producer of {name} failed (see {self.logs}/{name}.producer.log)")
            summaries[name] = json.loads(lines[-1])
        return summaries

    def drain(self, readers: dict[str, tuple[RunsReader, RunsReader]], t0: float) -> None:
        """Until every acknowledged message ran (or the drain time is up), then a quiet while for late copies."""
        deadline = t0 + self.scale.produce_s + self.scale.max_delay_s + self.scale.drain_s
        done: set[str] = set()
        while time.monotonic() < deadline:
            self.replace_exited_workers()
            for name, (sent, ran) in readers.items():
                sent.poll()
                ran.poll()
                if name not in done and len(ran.ids) >= len(sent.ids):
                    done.add(name)
            if len(done) == len(readers):
                break
            time.sleep(5.0)
        self.log(f"drained: {sorted(done)}; waiting {self.scale.quiet_s:.0f} s for late duplicates")
        time.sleep(self.scale.quiet_s)
        for sent, ran in readers.values():
            sent.poll()
            ran.poll()

    def check(self, readers: dict[str, tuple[RunsReader, RunsReader]]) -> list[LaneFigures]:
        figures = []
        for lane in LANES:
            sent, ran = readers[lane.name]
            due = {}
            for line in sent.lines:
                id, due_ms = line.decode().split(" ")
                due[id] = int(due_ms)
            figures.append(
                check_lane(
                    lane.name,
                    exactly_once=lane.exactly_once,
                    batch=lane.batch,
                    sent=due,
                    runs=(Run.parse(line) for line in ran.lines),
                    kills=self.kills,
                    outages=self.outages,
                    once=self.once_on(lane),
                )
            )
            self.inspect_store(lane, figures[-1])
        return figures

    def inspect_store(self, lane: Lane, figures: LaneFigures) -> None:
        """What the store holds at the end, and where it says each lost message is."""
        store = self.store_of(lane)
        stats = store.stats()
        figures.store = {"left_parked": stats.parked, "left_inflight": stats.inflight, "left_dead": stats.dead}
        figures.store |= {f"counter_{name}": value for name, value in sorted(stats.counters.items())}
        if self.once_on(lane):
            # The executions the workers recorded (one per promoted delivery that ran, kept for the window).
            figures.store["once_records"] = sum(
                1 for space in store.shards for _ in store.client.scan_iter(space.key("once:*"), count=1000)
            )
        for id in figures.lost:
            info = store.get(id)
            figures.lost_where[id] = self.find_in_broker(lane, id) if info is None else f"in the store: {info.state}"

    def find_in_broker(self, lane: Lane, id: str) -> str:
        """Where a message the store handed off is in a Redis broker now (the store kept no copy of it)."""
        if lane.broker != "redis":
            return "handed off"
        client = self.redis.client()
        try:
            needle = id.encode()
            for key in client.scan_iter(count=1000):
                kind = client.type(key)
                if kind == b"list":
                    values = client.lrange(key, 0, -1)
                elif kind == b"hash":
                    values = [*client.hkeys(key), *client.hvals(key)]
                elif kind == b"set":
                    values = list(client.smembers(key))
                elif kind == b"zset":
                    values = client.zrange(key, 0, -1)
                else:
                    continue
                if any(needle in value for value in values):
                    return f"handed off; now in {key.decode(errors='replace')}"
            return "handed off; in no key of the broker"
        finally:
            client.close()

    def report(self, figures: list[LaneFigures], producers: dict[str, Any], wall: float) -> Report:
        cores = os.cpu_count()
        memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
        machine = {
            "summary": f"{cores} cores, {memory_gib:.0f} GiB, {platform.system()} {platform.machine()}, "
            f"Python {platform.python_version()}",
        }
        events = {
            "messages": sum(f.messages for f in figures),
            "kills": len(self.kills),
            "workers_started": self.spawned,
            "workers_exited_by_themselves": self.exited,
            "redis_restarts": sum(1 for o in self.outages if o.server == "redis-server"),
            "rabbitmq_restarts": sum(1 for o in self.outages if o.server == "rabbitmq-server"),
            "failovers": sum(1 for o in self.outages if o.kind == "failover"),
            "producer_refusals": {name: summary["refusals"] for name, summary in producers.items()},
        }
        outages = [asdict(o) | {"lanes": sorted(o.lanes)} for o in self.outages]
        report = Report(self.scale_name, self.seed, wall, machine, [f.summary() for f in figures], events, self.once)
        report.events["outage_seconds"] = [round((o["end_ms"] - o["start_ms"]) / 1000, 1) for o in outages]
        report.timeline = {
            "origin_ms": self.origin_ms,
            "kills": [{"lane": kill.lane, "at_ms": kill.at_ms} for kill in self.kills],
            "outages": outages,
        }
        return report

    def log(self, text: str) -> None:
        print(f"[chaos] {text}", flush=True)

    def stop(self) -> None:
        for process in [*(w.process for w in self.workers), *self.producers.values()]:
            kill_group(process, signal.SIGTERM)
        for process in [*(w.process for w in self.workers), *self.producers.values()]:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                kill_group(process, signal.SIGKILL)
                process.wait(10)
            kill_group(process, signal.SIGKILL)  # a Dramatiq worker's children, if the parent went first
            if process.stdout is not None:
                process.stdout.close()
        for store in self.stores.values():
            with contextlib.suppress(Exception):
                store.client.close()
        for server in reversed(self.servers):
            with contextlib.suppress(Exception):
                server.close()
