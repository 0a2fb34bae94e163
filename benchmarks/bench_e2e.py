"""End to end against the native path, with real worker processes, on one redis-server.

A batch of tasks is sent with a delay so that all come due together a few seconds after the send; one real
worker (Dramatiq: 1 process x 8 threads; Celery: threads pool x 8) runs them. Per side and round: redis-server
CPU (/proc), the worker's CPU (/proc, its process tree), the commands, round trips and bytes the producer and the
worker sent (counted in their redis-py connections, :mod:`benchmarks.counting`), ``INFO commandstats`` per phase
(the send, then everything after it), the producer's wall time per send and last due -> last run. Sides alternate
round by round. Also: parks from 8 producer threads against native delayed sends, and the import weight.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from delay_broker import DelayStore
from delay_broker.dramatiq import DelayMiddleware

from . import bench_celery, bench_dramatiq, counting
from .apps.celery_app import make_app
from .apps.dramatiq_app import declare_e2e_probe
from .common import ROOT, WorkerProcess, delete_store, median, now_ms, wait_for
from .e2e_window import Snapshot, Watch, Window, server_pid, stats_table

QUEUE = "bench"
WARM_UP = 50
"""Sends before the window opens (connections made, scripts loaded), timed to choose the due time."""


@dataclass
class Round:
    """One side's run: the whole window (send and drain), the send phase alone, and the task figures."""

    mode: str
    window: Window
    send: Window
    send_us: float
    drain_ms: float
    lead_s: float
    margin_ms: float
    problems: list[str]


@dataclass
class Batch:
    """What a round sends: ``count`` tasks due at ``due_ms``, through ``send(n, due_ms)``."""

    count: int
    send: Callable[[int, float], None]


def _records(watch: Watch) -> list[tuple[int, float, float]]:
    rows = []
    for raw in watch.client.lrange(watch.records_key, 0, -1):
        n, due, started = raw.decode().split(",")
        rows.append((int(n), float(due), float(started)))
    return rows


def run_window(watch: Watch, batch: Batch, mode: str) -> Round:
    """Sends WARM_UP tasks due at once and waits for them (the worker and the producer warmed up, outside the
    window); then sends the rest of the batch, all due together once it is sent, and waits until every one ran."""
    warm_due = now_ms() + 500.0
    timed_from = 0.0
    for n in range(WARM_UP):
        if n == WARM_UP // 5:  # the first sends make connections and load scripts
            timed_from = time.perf_counter()
        batch.send(n, warm_due)
    per_send = (time.perf_counter() - timed_from) / (WARM_UP - WARM_UP // 5)
    wait_for(lambda: watch.recorded() >= WARM_UP, 60, f"{mode}: warm-up tasks ran", 0.05)
    time.sleep(0.3)  # the worker's counts published after them
    # Due once the rest is sent, with room for a slower send: the native workers take their messages meanwhile, on
    # the same cores (a native Celery producer sent 1.6 times slower than during the warm-up).
    lead_s = 3.0 + 2.0 * per_send * (batch.count - WARM_UP)
    first = Snapshot.take(watch)
    due = now_ms() + lead_s * 1000.0
    began = time.perf_counter()
    for n in range(WARM_UP, batch.count):
        batch.send(n, due)
    sent = time.perf_counter() - began
    margin_ms = due - now_ms()
    after_send = Snapshot.take(watch)
    wait_for(lambda: watch.recorded() >= batch.count, lead_s + 300, f"{batch.count} tasks ({mode}) ran", 0.05)
    time.sleep(0.3)  # the last records' counts published
    last = Snapshot.take(watch)
    rows = _records(watch)
    problems = []
    if len(rows) != batch.count or len({n for n, _, _ in rows}) != batch.count:
        problems.append(f"{mode}: {len(rows)} records of {len({n for n, _, _ in rows})} tasks for {batch.count} sent")
    early = sum(started < row_due - 1.0 for _, row_due, started in rows)
    if early:
        problems.append(f"{mode}: {early} tasks ran before their due time")
    if margin_ms < 200:  # the last sends were not parked ahead: the drain includes the end of the send
        problems.append(f"{mode}: the send ended {margin_ms:.0f} ms before the due time (less than 200)")
    return Round(
        mode,
        Window.between(first, last),
        Window.between(first, after_send),
        sent / (batch.count - WARM_UP) * 1e6,
        max(started for n, _, started in rows if n >= WARM_UP) - due,
        lead_s,
        margin_ms,
        problems,
    )


def _e2e_env(url: str, namespace: str) -> dict[str, str]:
    return {
        "BENCH_STOCK_PROMOTER": "1",
        "BENCH_E2E_RECORDS": f"{namespace}:e2e-records",
        "BENCH_E2E_COUNTS": f"{namespace}:e2e-counts",
    }


def _watch(url: str, redis_process: int, worker: WorkerProcess, env: dict[str, str]) -> Watch:
    client = counting.uncounted_client(url)
    return Watch(client, server_pid(redis_process), worker.process.pid, env["BENCH_E2E_COUNTS"],
                 env["BENCH_E2E_RECORDS"])  # fmt: skip


def dramatiq_round(url: str, redis_process: int, mode: str, count: int) -> Round:
    namespace = f"e2e-{mode}-{uuid.uuid4().hex[:6]}"
    env = {**bench_dramatiq.worker_env(url, mode, namespace), **_e2e_env(url, namespace)}
    worker = bench_dramatiq.start_worker(env, f"e2e-dramatiq-{mode}")
    watch = _watch(url, redis_process, worker, env)
    broker = RedisBroker(url=url, namespace=namespace)
    middleware = None
    try:
        if mode == "ours":
            middleware = DelayMiddleware(threshold=0, namespace=namespace, promote_in_workers=False)
            broker.add_middleware(middleware)
        actor = declare_e2e_probe(broker, QUEUE, None)

        def send(n: int, due: float) -> None:
            actor.send_with_options(args=(n, due), delay=max(1, math.ceil(due - now_ms())))

        result = run_window(watch, Batch(count, send), mode)
    finally:
        worker.close()
    if middleware is not None:
        delete_store(middleware.store)
    for key in watch.client.scan_iter(match=f"{namespace}:*"):
        watch.client.delete(key)
    broker.close()
    watch.client.close()
    return result


def celery_round(url: str, redis_process: int, mode: str, count: int) -> Round:
    env = bench_celery.env_for(url, url, mode)
    env.update(_e2e_env(url, env["BENCH_NS"]))
    worker = bench_celery.start_worker(env, f"e2e-celery-{mode}")
    watch = _watch(url, redis_process, worker, env)
    app = make_app(env)
    try:
        task = app.tasks["bench.e2e_probe"]

        def send(n: int, due: float) -> None:
            task.apply_async(args=(n, due), eta=datetime.fromtimestamp(due / 1000.0, timezone.utc))

        result = run_window(watch, Batch(count, send), mode)
    finally:
        worker.close()
        app.close()
    if mode == "ours":
        delete_store(DelayStore(watch.client, namespace=env["BENCH_NS"]))
    for pattern in (f"{env['BENCH_NS']}:*", f"{env['BENCH_QUEUE']}*"):
        for key in watch.client.scan_iter(match=pattern):
            watch.client.delete(key)
    watch.client.close()
    return result


def e2e(kind: str, url: str, redis_process: int, count: int, rounds: int) -> dict[str, list[Round]]:
    """``rounds`` rounds of each side of ``kind`` ("dramatiq" or "celery"), alternating which goes first."""
    one = dramatiq_round if kind == "dramatiq" else celery_round
    found: dict[str, list[Round]] = {"ours": [], "native": []}
    counting.install()
    try:
        for n in range(rounds):
            for mode in ("ours", "native") if n % 2 == 0 else ("native", "ours"):
                found[mode].append(one(url, redis_process, mode, count))
    finally:
        counting.uninstall()
    return found


PICKS: dict[str, Callable[[Round], float]] = {
    "redis_cpu": lambda r: r.window.redis_cpu_s,
    "worker_cpu": lambda r: r.window.worker_cpu_s,
    "drain": lambda r: r.drain_ms,
    "send": lambda r: r.send_us,
    "commands": lambda r: r.window.clients.commands,
    "round_trips": lambda r: r.window.clients.round_trips,
    "client_bytes": lambda r: r.window.clients.bytes_out,
    "script_calls": lambda r: r.window.script_calls,
}


def median_figure(rounds: dict[str, list[Round]], name: str) -> tuple[float, float]:
    """(ours, native): the median over each side's rounds of one of PICKS."""
    pick = PICKS[name]
    return median([pick(r) for r in rounds["ours"]]), median([pick(r) for r in rounds["native"]])


def commandstats_report(kind: str, rounds: dict[str, list[Round]]) -> str:
    """``INFO commandstats`` of both sides, for the send phase and for what follows it (due, promotion, fetch,
    runs, acks), added over the rounds."""
    ours, native = rounds["ours"], rounds["native"]
    send = stats_table(f"{kind}: the send", [r.send for r in ours], [r.send for r in native])
    after = stats_table(
        f"{kind}: after the send (promotion, fetch, runs, acks)",
        [r.window.minus(r.send) for r in ours],
        [r.window.minus(r.send) for r in native],
    )
    whole = stats_table(f"{kind}: the whole window", [r.window for r in ours], [r.window for r in native])
    return "\n\n".join((send, after, whole))


# -- Celery's park alone ------------------------------------------------------------------------------------------


def celery_park(url: str, count: int, rounds: int, ahead_s: float = 60.0) -> dict[str, float]:
    """Microseconds per ``apply_async(eta=now + ahead_s)`` with no worker running (in the e2e run the native worker
    takes its tasks while they are sent, on the same cores): ours (parked; 60 s ahead is not packed) against native
    (an LPUSH), in chunks of 250 alternating, ``count`` a side."""
    envs = {mode: bench_celery.env_for(url, url, mode) for mode in ("ours", "native")}
    apps = {mode: make_app(env) for mode, env in envs.items()}
    tasks = {mode: app.tasks["bench.e2e_probe"] for mode, app in apps.items()}
    counting.install()  # as in the e2e rounds: both sides pay the counting
    try:
        for task in tasks.values():  # connections made, scripts loaded
            for n in range(20):
                task.apply_async(args=(n, 0.0), eta=datetime.now(timezone.utc) + timedelta(seconds=ahead_s))
        spent = {"ours": 0.0, "native": 0.0}
        chunk, sent = 250, 0
        for n in range(max(1, count // chunk // rounds) * rounds):
            for mode in ("ours", "native") if n % 2 == 0 else ("native", "ours"):
                eta = datetime.now(timezone.utc) + timedelta(seconds=ahead_s)
                began = time.perf_counter()
                for i in range(chunk):
                    tasks[mode].apply_async(args=(i, 0.0), eta=eta)
                spent[mode] += time.perf_counter() - began
            sent += chunk
    finally:
        counting.uninstall()
    client = counting.uncounted_client(url)
    delete_store(DelayStore(client, namespace=envs["ours"]["BENCH_NS"]))
    for env in envs.values():
        for key in client.scan_iter(match=f"{env['BENCH_QUEUE']}*"):
            client.delete(key)
    client.close()
    for app in apps.values():
        app.close()
    ours, native = spent["ours"] / sent * 1e6, spent["native"] / sent * 1e6
    return {"celery_park_us_ours": ours, "celery_park_us_native": native, "celery_park_ratio": ours / native}


# -- parks from 8 threads ---------------------------------------------------------------------------------------


def park_concurrent(url: str, threads: int, per_thread: int, rounds: int) -> dict[str, float]:
    """Wall time per message of ``threads`` threads each sending ``per_thread`` messages delayed 1 h at once:
    DelayMiddleware (threshold 60 s, so parked) against plain RedisBroker's delayed send; sides alternate."""
    unique = uuid.uuid4().hex[:6]
    brokers = {"ours": RedisBroker(url=url, namespace=f"pc-o-{unique}"),
               "native": RedisBroker(url=url, namespace=f"pc-n-{unique}")}  # fmt: skip
    middleware = DelayMiddleware(threshold=60, namespace=f"pc-{unique}", promote_in_workers=False)
    brokers["ours"].add_middleware(middleware)
    actors = {mode: dramatiq.actor(broker=b, queue_name=QUEUE, actor_name="probe")(lambda n: None)
              for mode, b in brokers.items()}  # fmt: skip

    def burst(mode: str, each: int) -> float:
        start = threading.Barrier(threads + 1)
        failures: list[BaseException] = []

        def produce() -> None:
            start.wait()
            try:
                for i in range(each):
                    actors[mode].send_with_options(args=(i,), delay=3_600_000)
            except BaseException as error:  # reported by the main thread
                failures.append(error)

        workers = [threading.Thread(target=produce, daemon=True) for _ in range(threads)]
        for thread in workers:
            thread.start()
        start.wait()
        began = time.perf_counter()
        for thread in workers:
            thread.join()
        if failures:
            raise failures[0]
        return time.perf_counter() - began

    for mode in actors:  # warm-up: every thread's connection made, scripts loaded
        burst(mode, 20)
    spent = {"ours": 0.0, "native": 0.0}
    for n in range(rounds):
        for mode in ("ours", "native") if n % 2 == 0 else ("native", "ours"):
            spent[mode] += burst(mode, per_thread)
    sent = rounds * threads * per_thread
    parked = middleware.store.stats().parked
    if parked != sent + 20 * threads:
        raise RuntimeError(f"{parked} parked for {sent + 20 * threads} sent")
    delete_store(middleware.store)
    client = counting.uncounted_client(url)
    for key in client.scan_iter(match=f"pc-n-{unique}:*"):
        client.delete(key)
    client.close()
    for broker in brokers.values():
        broker.close()
    ours, native = spent["ours"] / sent * 1e6, spent["native"] / sent * 1e6
    return {"park_concurrent_us_ours": ours, "park_concurrent_us_native": native,
            "park_ratio_concurrent": ours / native}  # fmt: skip


# -- import weight ------------------------------------------------------------------------------------------------

DRAMATIQ_WORKER = """
import dramatiq
from dramatiq.brokers.redis import RedisBroker
broker = RedisBroker(url=URL, namespace="rss")
if WITH:
    from delay_broker.dramatiq import DelayMiddleware
    broker.add_middleware(DelayMiddleware(threshold=60, namespace="rss"))
dramatiq.actor(broker=broker, queue_name="rss", actor_name="probe")(lambda n: None)
"""

CELERY_WORKER = """
from celery import Celery
app = Celery("rss", broker=URL)
app.conf.task_default_queue = "rss"
app.conf.broker_connection_retry_on_startup = True
if WITH:
    import delay_broker.celery
    delay_broker.celery.install(app, threshold=60, namespace="rss")
app.task(name="rss.probe", shared=False)(lambda n: None)
connection = app.connection_for_write()
connection.ensure_connection(max_retries=1)
connection.default_channel
"""

REPORT = """
import gc, json, sys
gc.collect()
rss = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS:"))
packages = sorted({name.split(".")[0] for name in sys.modules} - set(sys.stdlib_module_names) - {"__mp_main__"})
print(json.dumps({"rss_kb": rss, "modules": len(sys.modules), "packages": packages}))
"""


def _rss_once(url: str, code: str, with_delay_broker: bool) -> dict[str, Any]:
    prelude = f"URL = {url!r}\nWITH = {with_delay_broker!r}\n"
    # With bytecode caches, as an installed worker runs: compiling every module at import (PYTHONDONTWRITEBYTECODE
    # and no caches yet) leaves a process 16 MB larger.
    env = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
    output = subprocess.run(
        [sys.executable, "-c", prelude + code + REPORT], cwd=ROOT, env=env, capture_output=True, text=True,
        check=True, timeout=120,
    ).stdout  # fmt: skip
    found: dict[str, Any] = json.loads(output.strip().splitlines()[-1])
    return found


def import_rss(url: str, framework: str, runs: int = 3) -> dict[str, Any]:
    """RSS (MB) of a fresh process set up as a worker is before any message, with and without delay_broker,
    median of ``runs`` each (alternating), and the packages (not the standard library's) only the first loads."""
    code = DRAMATIQ_WORKER if framework == "dramatiq" else CELERY_WORKER
    rss: dict[bool, list[float]] = {True: [], False: []}
    seen: dict[bool, dict[str, Any]] = {}
    for with_delay_broker in (True, False):  # not counted: bytecode caches written, files in the page cache
        _rss_once(url, code, with_delay_broker)
    for n in range(runs):
        for with_delay_broker in (True, False) if n % 2 == 0 else (False, True):
            found = _rss_once(url, code, with_delay_broker)
            rss[with_delay_broker].append(found["rss_kb"] / 1024)
            seen[with_delay_broker] = found
    return {
        "with_mb": median(rss[True]),
        "without_mb": median(rss[False]),
        "delta_mb": median(rss[True]) - median(rss[False]),
        "packages": sorted(
            name for name in set(seen[True]["packages"]) - set(seen[False]["packages"]) if not name.startswith("_")
        ),
        "extra_modules": seen[True]["modules"] - seen[False]["modules"],
    }
