"""Celery side by side: delay_broker's transport vs native ETA tasks vs celery-longterm-scheduler (lts).

celery-longterm-scheduler parks ``apply_async(eta=...)`` calls (SET + ZADD in a dedicated Redis database) and is
promoted by ``celery longterm_scheduler``, a command its README says to run from cron ("e.g. every 5 minutes").
Here that command runs in a loop every ``lts_interval`` seconds (1 s by default: far more often than cron can),
as a fresh process each time, exactly as cron would start it.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import redis
from celery import Celery

import delay_broker.celery
from delay_broker import DelayStore

from .apps.celery_app import make_app
from .common import ROOT, Lateness, WorkerProcess, now_ms, python_command, read_json_list, read_records, wait_for

MODES = ("ours", "native", "lts")
LABELS = {"ours": "delay_broker + Celery", "native": "native Celery ETA", "lts": "celery-longterm-scheduler"}


def env_for(url: str, lts_url: str, mode: str) -> dict[str, str]:
    unique = uuid.uuid4().hex[:6]
    return {
        "BENCH_REDIS_URL": url,
        "BENCH_LTS_URL": lts_url,
        "BENCH_MODE": mode,
        "BENCH_NS": f"celery-{unique}",
        "BENCH_QUEUE": f"bench-{mode}-{unique}",
        "BENCH_RECORDS": f"celery-{unique}:records",
        "BENCH_PROMOTER": f"celery-{unique}:promoter",
    }


def start_worker(env: dict[str, str], name: str, concurrency: int = 8) -> WorkerProcess:
    command = python_command(
        "-m", "celery", "-A", "benchmarks.apps.celery_app", "worker", "--pool", "threads", "-c", str(concurrency),
        "-l", "INFO", "-n", f"{name}-{uuid.uuid4().hex[:6]}@%h", "--without-gossip", "--without-mingle",
        "--without-heartbeat",
    )  # fmt: skip
    worker = WorkerProcess(command, env, name)
    worker.wait_ready(" ready.", f"celery worker {name} ready")
    return worker


def eta_of(due_ms: float) -> datetime:
    return datetime.fromtimestamp(due_ms / 1000.0, timezone.utc)


class LtsCron:
    """Runs ``celery -A benchmarks.apps.celery_app longterm_scheduler`` every ``interval`` s until stopped."""

    def __init__(self, env: dict[str, str], interval: float) -> None:
        self.env = env
        self.interval = interval
        self.runs: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> LtsCron:
        self._thread.start()
        return self

    def _loop(self) -> None:
        command = python_command("-m", "celery", "-A", "benchmarks.apps.celery_app", "longterm_scheduler")
        env = {**os.environ, **self.env, "PYTHONPATH": str(ROOT)}
        next_at = time.monotonic()
        while not self._stop.is_set():
            started = time.monotonic()
            subprocess.run(
                command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False
            )
            self.runs.append(time.monotonic() - started)
            next_at += self.interval
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)


def flush(url: str, lts_url: str) -> None:
    for address in (url, lts_url):
        client = redis.Redis.from_url(address)
        client.flushdb()
        client.close()


# -- lateness ---------------------------------------------------------------------------------------------------


def lateness(
    url: str, lts_url: str, mode: str, rate: int, seconds: float, lead_s: float, lts_interval: float
) -> tuple[Lateness, Lateness | None, dict[str, float]]:
    flush(url, lts_url)
    env = env_for(url, lts_url, mode)
    client = redis.Redis.from_url(url)
    worker = start_worker(env, f"celery-{mode}")
    app = make_app(env)
    probe = app.tasks["bench.probe"]
    cron = LtsCron(env, lts_interval) if mode == "lts" else None
    extra: dict[str, float] = {}
    try:
        probe.apply_async(args=(now_ms(),))  # warm up the producer's connection
        time.sleep(1.0)
        if cron is not None:
            cron.start()
        count = int(rate * seconds)
        first = now_ms() + lead_s * 1000
        late = 0
        for n in range(count):
            due = first + n * 1000.0 / rate
            late += due <= now_ms()
            probe.apply_async(args=(due,), eta=eta_of(due))
        extra["late_sends"] = late
        wait_for(
            lambda: client.llen(env["BENCH_RECORDS"]) >= count + 1,
            lead_s + seconds + 90,
            f"{count} celery ({mode}) tasks ran",
            interval=0.5,
        )
        time.sleep(0.5)
    finally:
        if cron is not None:
            cron.stop()
            extra["lts_command_s"] = sum(cron.runs) / max(1, len(cron.runs))
        worker.stop()
        worker.close()
        app.close()
    samples = [started - due for due, started in read_records(client, env["BENCH_RECORDS"])][1:]
    e2e = Lateness(LABELS[mode], samples, count)
    promoter = None
    if mode == "ours":
        promoter = Lateness("promotion step (Celery)", read_json_list(client, env["BENCH_PROMOTER"]), count)
    client.close()
    return e2e, promoter, extra


# -- park cost and drain rate: ours vs native vs lts -----------------------------------------------------------------


def park_costs(url: str, lts_url: str, count: int, rounds: int) -> dict[str, float]:
    """Microseconds per ``apply_async(eta=now + 1 h)``, interleaved in chunks of 250 per mode."""
    flush(url, lts_url)
    apps = {mode: make_app(env_for(url, lts_url, mode)) for mode in MODES}
    tasks = {mode: app.tasks["bench.probe"] for mode, app in apps.items()}
    for task in tasks.values():  # warm-up: connections, script loading
        for _ in range(20):
            task.apply_async(args=(0,), eta=datetime.now(timezone.utc) + timedelta(hours=1))
    spent = dict.fromkeys(MODES, 0.0)
    chunk = 250
    per_round = max(chunk, count // rounds)
    sent = 0
    for n in range(rounds):
        for start in range(0, per_round, chunk):
            order = list(MODES[n % 3 :] + MODES[: n % 3])
            for mode in order if (start // chunk) % 2 == 0 else order[::-1]:
                task = tasks[mode]
                eta = datetime.now(timezone.utc) + timedelta(hours=1)
                began = time.perf_counter()
                for _ in range(chunk):
                    task.apply_async(args=(0,), eta=eta)
                spent[mode] += time.perf_counter() - began
            sent += chunk
    ours = delay_broker.celery.store_for(apps["ours"]).stats().parked
    assert ours == sent + 20, (ours, sent)
    for app in apps.values():
        app.close()
    flush(url, lts_url)
    return {f"celery_park_{mode}_us": spent[mode] / sent * 1e6 for mode in MODES}


def drain_rates(url: str, lts_url: str, count: int, rounds: int) -> dict[str, Any]:
    """Due tasks promoted into the queue per second: our promoter (direct path) vs one ``longterm_scheduler``
    run (timed in-process: ``get_scheduler(app).execute_pending(now)``, what the command calls)."""
    import celery_longterm_scheduler

    rates: dict[str, list[float]] = {"ours": [], "lts": []}
    command_s: list[float] = []
    for n in range(rounds):
        for mode in ("ours", "lts") if n % 2 == 0 else ("lts", "ours"):
            flush(url, lts_url)
            env = env_for(url, lts_url, mode)
            app = make_app(env)
            task = app.tasks["bench.probe"]
            client = redis.Redis.from_url(url)
            if mode == "ours":
                # Parked 1 h ahead (every task must still be in the future when sent: threshold 0), then all made
                # due at once by moving their scores; the measure is the move into the queue (no worker runs).
                for _ in range(count):
                    task.apply_async(args=(0,), eta=datetime.now(timezone.utc) + timedelta(hours=1))
                store = delay_broker.celery.store_for(app)
                ids = [message.id for message in store.iter_all("due", page=1000)]
                assert len(ids) == count, "not every task was parked"
                # Tasks an hour ahead are packed: into the ordinary layout first, as promoters would open them.
                opener = DelayStore(store.client, namespace=store.keys.namespace, pack_after=10 * 365 * 86400)
                while opener.open_packs(0, calls=100) is not None:
                    pass
                score = int(time.time() * 1000) * 1024
                for first in range(0, count, 1000):
                    store.client.zadd(store.keys.due, dict.fromkeys(ids[first : first + 1000], score))
                promoter = delay_broker.celery.build_promoter(app, batch=1000)
                began = time.perf_counter()
                while promoter.counters.promoted < count:
                    promoter.step()
                    if time.perf_counter() - began > 600:
                        raise TimeoutError(f"only {promoter.counters.promoted} of {count} promoted in 600 s")
                rates["ours"].append(count / (time.perf_counter() - began))
            else:
                eta = datetime.now(timezone.utc) - timedelta(seconds=1)
                for _ in range(count):
                    task.apply_async(args=(0,), eta=eta)
                scheduler = celery_longterm_scheduler.get_scheduler(app)
                began = time.perf_counter()
                scheduler.execute_pending(datetime.now(timezone.utc))
                rates["lts"].append(count / (time.perf_counter() - began))
            queued = int(client.llen(env["BENCH_QUEUE"]))
            assert queued == count, (mode, queued, count)
            client.close()
            app.close()
    # The command as cron runs it: a fresh process (imports, app set-up) for one batch.
    flush(url, lts_url)
    env = env_for(url, lts_url, "lts")
    app = make_app(env)
    for _ in range(min(count, 1000)):
        app.tasks["bench.probe"].apply_async(args=(0,), eta=datetime.now(timezone.utc) - timedelta(seconds=1))
    began = time.perf_counter()
    subprocess.run(
        python_command("-m", "celery", "-A", "benchmarks.apps.celery_app", "longterm_scheduler"),
        cwd=ROOT,
        env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
    )
    command_s.append(time.perf_counter() - began)
    app.close()
    flush(url, lts_url)
    return {
        "celery_drain_ours_msgs_per_s": max(rates["ours"]),
        "celery_drain_lts_msgs_per_s": max(rates["lts"]),
        "celery_drain_ratio_vs_lts": max(rates["ours"]) / max(rates["lts"]),
        "lts_command_1000_s": command_s[0],
    }


# -- worker fetch: reliable vs kombu's ---------------------------------------------------------------------------


def fetch_rates(url: str, lts_url: str, count: int, rounds: int) -> dict[str, float]:
    """Ready tasks a worker (8 threads) runs per second with our reliable fetch and with kombu's own ``BRPOP``.

    ``count`` tasks without an eta are queued, then one worker drains them; the rate is taken between the first
    and the last task start the probe recorded, so the worker's start-up is left out. Modes alternate per round.
    """
    rates: dict[str, list[float]] = {"reliable": [], "kombu": []}
    for n in range(rounds):
        for mode in ("reliable", "kombu") if n % 2 == 0 else ("kombu", "reliable"):
            flush(url, lts_url)
            env = {**env_for(url, lts_url, "ours"), "BENCH_RELIABLE_FETCH": "1" if mode == "reliable" else "0"}
            app = make_app(env)
            task = app.tasks["bench.probe"]
            for _ in range(count):
                task.apply_async(args=(0,))
            client = redis.Redis.from_url(url)
            worker = start_worker(env, f"fetch-{mode}")
            records = env["BENCH_RECORDS"]
            try:
                wait_for(lambda c=client, k=records: c.llen(k) >= count, 600, f"{count} tasks run")
            finally:
                worker.stop()
            starts = sorted(started for _, started in read_records(client, env["BENCH_RECORDS"]))
            rates[mode].append((count - 1) / max((starts[-1] - starts[0]) / 1000.0, 1e-3))
            client.close()
            app.close()
    flush(url, lts_url)
    best = {mode: max(values) for mode, values in rates.items()}
    return {
        "celery_fetch_reliable_msgs_per_s": best["reliable"],
        "celery_fetch_kombu_msgs_per_s": best["kombu"],
        "celery_fetch_ratio": best["reliable"] / best["kombu"],
    }


# -- worker memory with ETA tasks ------------------------------------------------------------------------------------


def worker_rss(url: str, lts_url: str, mode: str, count: int) -> dict[str, float]:
    flush(url, lts_url)
    env = env_for(url, lts_url, mode)
    worker = start_worker(env, f"celery-rss-{mode}")
    app: Celery = make_app(env)
    client = redis.Redis.from_url(url)
    try:
        task = app.tasks["bench.probe"]
        time.sleep(3.0)
        before = worker.rss_mb()
        eta = datetime.now(timezone.utc) + timedelta(hours=1)
        for _ in range(count):
            task.apply_async(args=(0,), eta=eta)
        if mode == "native":
            wait_for(lambda: client.llen(env["BENCH_QUEUE"]) == 0, 300, "the worker received every ETA task")
        time.sleep(3.0)
        after = worker.rss_mb()
    finally:
        worker.stop()
        worker.close()
        app.close()
        client.close()
    flush(url, lts_url)
    return {"before_mb": before, "after_mb": after, "growth_mb": after - before}
