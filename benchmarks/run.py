"""delay_broker side by side with the native paths and the raw Redis limit, in one run.

    python -m benchmarks [--scale small|default|full] [--only drain,lateness,...] [--no-results]
    python benchmarks/run.py ...

Starts its own redis-server, RabbitMQ node and moto SQS server (free ports, temporary directories), runs
every measure against its reference interleaved in the same run, prints a table and ``name=value`` lines,
and (unless --no-results) rewrites the generated part of benchmarks/RESULTS.md and benchmarks/results.png.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import signal
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # python benchmarks/run.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "benchmarks"

import redis

from delay_broker.embedded import EmbeddedRedis

from . import bench_celery, bench_core, bench_dramatiq, bench_e2e, bench_tier
from .common import HERE, Lateness, delete_store
from .report import E2E, MAIN, Report, RunInfo, load_average, write_results

MEASURES = ("drain", "scale", "publish", "park", "lateness", "rss", "memory", "tier", "idle", "competitor", "e2e")


@dataclass(frozen=True)
class Sizes:
    drain: int
    drain_rounds: int
    batch: int
    scale_parked: int
    scale_due: int
    scale_rounds: int
    rabbit: int
    sqs: int
    publish_rounds: int
    park: int
    park_rounds: int
    rate: int
    seconds: float
    lead: float
    rss: int
    celery_drain: int
    celery_park: int
    memory: int
    idle_promoters: int
    idle_seconds: float
    lts_interval: float
    e2e_dramatiq: int
    e2e_celery: int
    e2e_rounds: int
    park_threads: int
    park_per_thread: int


SCALES = {
    "small": Sizes(20_000, 2, 1000, 100_000, 5_000, 3, 500, 200, 2, 2_000, 2, 1000, 5, 3, 10_000, 2_000, 1_500,
                   100_000, 2, 6, 1.0, 2_000, 1_000, 1, 8, 100),
    "default": Sizes(200_000, 3, 1000, 1_000_000, 10_000, 5, 3_000, 600, 3, 10_000, 4, 1000, 30, 3, 50_000,
                     20_000, 6_000, 1_000_000, 4, 20, 1.0, 20_000, 5_000, 2, 8, 500),
    "full": Sizes(1_000_000, 3, 1000, 10_000_000, 10_000, 5, 10_000, 2_000, 3, 20_000, 4, 1000, 30, 3, 100_000,
                  50_000, 10_000, 5_000_000, 4, 30, 1.0, 20_000, 5_000, 3, 8, 1000),
}  # fmt: skip


@contextlib.contextmanager
def servers(
    need_rabbit: bool, need_sqs: bool, need_postgres: bool = False, redis_server: str | None = None
) -> Iterator[dict[str, Any]]:
    from integration.servers import AWS_TEST_ENV, MotoServer, PostgresServer, RabbitNode

    for name, value in AWS_TEST_ENV.items():
        os.environ.setdefault(name, value)
    started: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        # A few hundred MB of parked messages at the default scale: no persistence, no eviction.
        started["redis"] = stack.enter_context(
            EmbeddedRedis(["--appendonly", "no", "--maxmemory", "0"], executable=redis_server)
        )
        if need_rabbit:
            node = RabbitNode()
            stack.callback(node.close)
            started["rabbit"] = node.start()
        if need_sqs:
            moto = MotoServer()
            stack.callback(moto.close)
            started["sqs"] = moto.start()
        if need_postgres:
            postgres = PostgresServer()
            stack.callback(postgres.close)
            started["postgres"] = postgres.start()
        yield started


def section(title: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    def wrap(function: Callable[..., None]) -> Callable[..., None]:
        def run(*args: Any) -> None:
            began = time.monotonic()
            print(f"[{time.strftime('%H:%M:%S')}] {title} ...", flush=True)
            function(*args)
            print(f"[{time.strftime('%H:%M:%S')}] {title}: {time.monotonic() - began:.0f} s", flush=True)

        return run

    return wrap


@section("drain into Dramatiq RedisBroker vs bare Lua move")
def run_drain(report: Report, s: Sizes, env: dict[str, Any]) -> None:
    result = bench_dramatiq.drain_ratio(env["redis"].url, s.drain, s.batch, s.drain_rounds)
    report.add(
        f"1. drain {s.drain:,} due msgs, msgs/s (best of {s.drain_rounds})",
        result["drain_msgs_per_s"],
        result["drain_bare_msgs_per_s"],
        "drain_ratio",
        result["drain_ratio"],
    )
    report.rates["drain: delay_broker (Dramatiq direct)"] = result["drain_msgs_per_s"]
    report.rates["drain: bare Lua move"] = result["drain_bare_msgs_per_s"]


@section("publish into RabbitMQ and SQS vs direct publishing")
def run_publish(report: Report, s: Sizes, env: dict[str, Any]) -> None:
    from dramatiq.brokers.rabbitmq import RabbitmqBroker
    from dramatiq_sqs import SQSBroker

    url = env["redis"].url
    rabbit_url = env["rabbit"].url.rstrip("/") + "/%2F"
    rabbit = bench_dramatiq.publish_ratio(
        lambda: RabbitmqBroker(url=rabbit_url, confirm_delivery=True), url, s.rabbit, s.batch, s.publish_rounds
    )
    report.add(
        f"2. promote {s.rabbit:,} into RabbitMQ (confirms), msgs/s",
        rabbit["ours"],
        rabbit["direct"],
        "publish_ratio_rabbitmq",
        rabbit["ratio"],
    )
    endpoint = env["sqs"].endpoint_url
    namespace = f"bench{uuid.uuid4().hex[:6]}"
    sqs = bench_dramatiq.publish_ratio(
        lambda: SQSBroker(namespace=namespace, endpoint_url=endpoint, region_name="us-east-1"),
        url,
        s.sqs,
        s.batch,
        s.publish_rounds,
    )
    report.add(
        f"2. promote {s.sqs:,} into SQS (moto), msgs/s", sqs["ours"], sqs["direct"], "publish_ratio_sqs", sqs["ratio"]
    )
    report.rates["RabbitMQ: promoter"] = rabbit["ours"]
    report.rates["RabbitMQ: direct enqueue"] = rabbit["direct"]
    report.rates["SQS: promoter"] = sqs["ours"]
    report.rates["SQS: direct enqueue"] = sqs["direct"]


@section("park (delay=1 h) vs native delayed send")
def run_park(report: Report, s: Sizes, env: dict[str, Any]) -> None:
    result = bench_dramatiq.park_ratio(env["redis"].url, s.park, s.park_rounds)
    report.add(
        f"3. send_with_options(delay=1h), us/msg ({result['park_sent']:,} each)",
        result["park_us"],
        result["park_native_us"],
        "park_ratio",
        result["park_ratio"],
    )


@section("lateness with real workers")
def run_lateness(report: Report, s: Sizes, env: dict[str, Any]) -> None:
    url = env["redis"].url
    lts_url = url[: url.rindex("/")] + "/1"
    results: dict[str, Lateness] = {}
    promoters: dict[str, Lateness] = {}
    late_sends = 0
    # Ours and the native path alternate, so a busy spell of the machine is less likely to hit one only.
    for kind, mode in (("dramatiq", "ours"), ("dramatiq", "native"), ("celery", "ours"), ("celery", "native")):
        if kind == "dramatiq":
            e2e, promoter, late = bench_dramatiq.lateness(url, mode, s.rate, s.seconds, s.lead)
        else:
            e2e, promoter, extra = bench_celery.lateness(url, lts_url, mode, s.rate, s.seconds, s.lead, s.lts_interval)
            late = int(extra.get("late_sends", 0))
        late_sends += late
        results[f"{kind}-{mode}"] = e2e
        if promoter is not None:
            promoters[kind] = promoter
    schedule = f"{s.rate:,}/s for {s.seconds:g} s"
    for kind, promoter in promoters.items():
        prefix = "lateness" if kind == "dramatiq" else "lateness_celery_promoter"
        report.add(
            f"4. promotion step ({kind}), p50 ms, {schedule}", promoter.p50, "", f"{prefix}_p50_ms", promoter.p50
        )
        report.add(f"4. promotion step ({kind}), p99 ms", promoter.p99, "", f"{prefix}_p99_ms", promoter.p99)
        report.lateness.append(promoter)
    for kind in ("dramatiq", "celery"):
        ours, native = results[f"{kind}-ours"], results[f"{kind}-native"]
        for q in (50, 99):
            mine, theirs = (ours.p50, native.p50) if q == 50 else (ours.p99, native.p99)
            report.add(f"4. end to end ({kind}) vs native, p{q} ms", mine, theirs, f"lateness_e2e_{kind}_p{q}_ms", mine)
            report.values[f"lateness_native_{kind}_p{q}_ms"] = theirs
        report.lateness.extend([ours, native])
        missing = ours.missing + native.missing
        if missing:
            report.note(f"{kind}: {missing} lateness records missing")
    report.values["lateness_late_sends"] = late_sends


@section("worker memory with delayed messages")
def run_rss(report: Report, s: Sizes, env: dict[str, Any]) -> None:
    url = env["redis"].url
    lts_url = url[: url.rindex("/")] + "/1"
    native = bench_dramatiq.worker_rss(url, "native", s.rss)
    ours = bench_dramatiq.worker_rss(url, "ours", s.rss)
    report.add(
        f"5. Dramatiq worker RSS MB, {s.rss:,} msgs delayed 1 h",
        ours["after_mb"],
        native["after_mb"],
        "worker_rss_ratio",
        ours["after_mb"] / native["after_mb"],
    )
    report.add("5. Dramatiq worker RSS growth MB", ours["growth_mb"], native["growth_mb"], "worker_rss_growth_mb",
               ours["growth_mb"])  # fmt: skip
    report.values["worker_rss_native_mb"] = native["after_mb"]
    report.values["worker_rss_ours_mb"] = ours["after_mb"]
    report.values["worker_rss_native_growth_mb"] = native["growth_mb"]
    c_native = bench_celery.worker_rss(url, lts_url, "native", s.rss)
    c_ours = bench_celery.worker_rss(url, lts_url, "ours", s.rss)
    report.add(
        f"5. Celery worker RSS MB, {s.rss:,} ETA tasks 1 h",
        c_ours["after_mb"],
        c_native["after_mb"],
        "celery_worker_rss_ratio",
        c_ours["after_mb"] / c_native["after_mb"],
    )
    report.add("5. Celery worker RSS growth MB", c_ours["growth_mb"], c_native["growth_mb"],
               "celery_worker_rss_growth_mb", c_ours["growth_mb"])  # fmt: skip
    report.values["celery_worker_rss_native_mb"] = c_native["after_mb"]
    report.values["celery_worker_rss_ours_mb"] = c_ours["after_mb"]
    report.values["celery_worker_rss_native_growth_mb"] = c_native["growth_mb"]


@section("Redis memory per parked message")
def run_memory(report: Report, s: Sizes, env: dict[str, Any]) -> None:
    client = env["redis"].client()
    ours = bench_core.bytes_per_parked(client, s.memory)
    ordinary = bench_core.bytes_per_parked(client, s.memory, pack_after=None)
    json_records = bench_core.bytes_per_parked(client, s.memory, record_version=1, pack_after=None)
    floor = bench_core.bytes_per_parked_floor(client, s.memory)
    size = f"{s.memory:,} x {bench_core.MEMORY_PAYLOAD} B"
    report.add(f"6. Redis bytes per parked msg beyond payload ({size})", ours, floor, "bytes_per_parked", ours)
    report.add(f"6. the same, not packed (pack_after=None, {size})", ordinary, floor, "bytes_per_parked_ordinary",
               ordinary)  # fmt: skip
    report.add(f"6. not packed, with JSON-header records ({size})", json_records, floor, "bytes_per_parked_json",
               json_records)  # fmt: skip
    report.values["bytes_per_parked_floor"] = floor
    client.close()


@section("far tier (PostgreSQL): Redis memory, sweep rate, lateness")
def run_tier(report: Report, s: Sizes, env: dict[str, Any]) -> None:
    client, url = env["redis"].client(), env["postgres"].url
    count = s.memory // 10
    far_bytes = bench_tier.redis_bytes_per_far_message(client, url, count)
    report.add(f"10. Redis bytes per far message ({count:,} x {bench_core.MEMORY_PAYLOAD} B)", far_bytes,
               report.values.get("bytes_per_parked", math.nan), "redis_bytes_per_far_message", far_bytes)  # fmt: skip
    rates = bench_tier.sweep_rates(client, url, count // 2)
    ratio = rates["tier_sweep_rate"] / rates["tier_raw_insert_rate"]
    swept, raw = rates["tier_sweep_rate"], rates["tier_raw_insert_rate"]
    report.add("10. far rows swept into Redis /s vs parks /s straight in", swept, raw, "tier_sweep_rate", swept,
               f" ({ratio:.2f}x)")  # fmt: skip
    report.values["tier_raw_insert_rate"] = rates["tier_raw_insert_rate"]
    report.values["tier_sweep_ratio"] = ratio
    found = bench_tier.lateness(client, url, min(s.park, 5000))
    tiered, plain = (Lateness(label, found[label], len(found[label])) for label in ("tiered", "redis_only"))
    report.add("10. lateness p99 ms: swept in from PostgreSQL vs parked in Redis", tiered.p99, plain.p99,
               "tier_lateness_p99_ms", tiered.p99)  # fmt: skip
    report.values["tier_lateness_p50_ms"] = tiered.p50
    report.values["tier_lateness_redis_only_p99_ms"] = plain.p99
    client.close()


@section("drain rate with many far-future messages")
def run_scale(report: Report, s: Sizes, env: dict[str, Any]) -> None:
    result = bench_dramatiq.scale_ratio(env["redis"].url, s.scale_parked, s.scale_due, s.batch, s.scale_rounds)
    report.add(
        f"7. drain {s.scale_due:,} due beside {s.scale_parked:,} parked vs alone, msgs/s",
        result["scale_large_msgs_per_s"],
        result["scale_small_msgs_per_s"],
        "scale_ratio",
        result["scale_ratio"],
    )
    report.values["scale_redis_mb"] = result["scale_redis_mb"]
    report.rates[f"drain beside {s.scale_parked:,} parked"] = result["scale_large_msgs_per_s"]
    report.rates[f"drain with {s.scale_due:,} parked"] = result["scale_small_msgs_per_s"]


@section("idle promoters")
def run_idle(report: Report, s: Sizes, env: dict[str, Any]) -> None:
    from dramatiq.brokers.redis import RedisBroker

    from delay_broker.dramatiq import DelayMiddleware, build_promoter

    url = env["redis"].url
    client = redis.Redis.from_url(url)
    namespace = f"idle-{uuid.uuid4().hex[:6]}"
    broker = RedisBroker(url=url, namespace=namespace)
    middleware = DelayMiddleware(threshold=0, namespace=namespace, promote_in_workers=False)
    broker.add_middleware(middleware)
    import dramatiq

    actor = dramatiq.actor(broker=broker, queue_name="bench", actor_name="probe")(lambda n: None)
    for n in range(100):
        actor.send_with_options(args=(n,), delay=86_400_000 + n)
    promoters = [build_promoter(broker).start() for _ in range(s.idle_promoters)]
    time.sleep(1.0)
    before = bench_core.client_round_trips(client)
    time.sleep(s.idle_seconds)
    after = bench_core.client_round_trips(client)
    for promoter in promoters:
        promoter.stop()
    per = (after - before) / s.idle_seconds / s.idle_promoters
    label = f"8. idle promoters ({s.idle_promoters}), round trips/s each, {s.idle_seconds:g} s"
    report.add(label, per, "", "idle_calls_per_s", per)
    delete_store(middleware.store)
    client.close()
    broker.close()


@section("competitor: celery-longterm-scheduler")
def run_competitor(report: Report, s: Sizes, env: dict[str, Any]) -> None:
    url = env["redis"].url
    lts_url = url[: url.rindex("/")] + "/1"
    park = bench_celery.park_costs(url, lts_url, s.celery_park, 3)
    report.add(
        "9. Celery apply_async(eta=+1h) us/msg: ours vs native",
        park["celery_park_ours_us"],
        park["celery_park_native_us"],
        "celery_park_1h_ratio",
        park["celery_park_ours_us"] / park["celery_park_native_us"],
    )
    report.add(
        "9. Celery apply_async(eta=+1h) us/msg: ours vs lts",
        park["celery_park_ours_us"],
        park["celery_park_lts_us"],
        "celery_park_ratio_vs_lts",
        park["celery_park_ours_us"] / park["celery_park_lts_us"],
    )
    fetch = bench_celery.fetch_rates(url, lts_url, s.celery_park, 2)
    report.add(
        f"9. Celery worker runs {s.celery_park:,} ready tasks, msgs/s: reliable fetch vs kombu's",
        fetch["celery_fetch_reliable_msgs_per_s"],
        fetch["celery_fetch_kombu_msgs_per_s"],
        "celery_fetch_ratio",
        fetch["celery_fetch_ratio"],
    )
    drain = bench_celery.drain_rates(url, lts_url, s.celery_drain, 2)
    report.add(
        f"9. Celery drain {s.celery_drain:,} due, msgs/s: ours vs lts",
        drain["celery_drain_ours_msgs_per_s"],
        drain["celery_drain_lts_msgs_per_s"],
        "celery_drain_ratio_vs_lts",
        drain["celery_drain_ratio_vs_lts"],
    )
    report.values["lts_command_1000_s"] = drain["lts_command_1000_s"]
    report.rates["Celery: delay_broker promoter"] = drain["celery_drain_ours_msgs_per_s"]
    report.rates["Celery: longterm_scheduler"] = drain["celery_drain_lts_msgs_per_s"]
    e2e, _, extra = bench_celery.lateness(url, lts_url, "lts", s.rate, s.seconds, s.lead, s.lts_interval)
    ours_p50 = report.values.get("lateness_e2e_celery_p50_ms", math.nan)
    ours_p99 = report.values.get("lateness_e2e_celery_p99_ms", math.nan)
    label = f"9. Celery end to end p50 ms: ours vs lts (command every {s.lts_interval:g} s)"
    report.add(label, ours_p50, e2e.p50, "lateness_lts_p50_ms", e2e.p50)
    report.add("9. Celery end to end p99 ms: ours vs lts", ours_p99, e2e.p99, "lateness_lts_p99_ms", e2e.p99)
    report.values["lateness_lts_min_ms"] = e2e.min
    report.values["lts_command_avg_s"] = extra.get("lts_command_s", math.nan)
    report.lateness.append(e2e)


E2E_FIGURES = (
    ("redis_cpu", "s", "redis-server CPU s"),
    ("worker_cpu", "s", "worker CPU s (process tree)"),
    ("drain", "ms", "last due -> last run ms"),
    ("send", "us", "producer's send us/msg"),
    ("commands", "", "client commands (producer + worker)"),
    ("round_trips", "", "client round trips (socket writes)"),
    ("client_bytes", "", "bytes clients sent"),
    ("script_calls", "", ""),  # native Celery runs none: no ratio, the counts alone
)


@section("end to end with real workers, parks from 8 threads, import weight")
def run_e2e(report: Report, s: Sizes, env: dict[str, Any]) -> None:
    url, process = env["redis"].url, env["redis"].process.pid
    for n, (kind, count, worker) in enumerate(
        (("dramatiq", s.e2e_dramatiq, "1 process x 8 threads"), ("celery", s.e2e_celery, "threads pool x 8"))
    ):
        rounds = bench_e2e.e2e(kind, url, process, count, s.e2e_rounds)
        prefix = f"{kind}_e2e"
        title = f"{11 + n}. {kind.capitalize()} e2e, {count:,} due together, {worker}"
        for stem, unit, label in E2E_FIGURES:
            ours, native = bench_e2e.median_figure(rounds, stem)
            if label:
                report.add(f"{title}: {label}", ours, native, f"{prefix}_{stem}_ratio", ours / native)
            suffix = f"_{unit}" if unit else ""
            report.values[f"{prefix}_{stem}{suffix}_ours"] = ours
            report.values[f"{prefix}_{stem}{suffix}_native"] = native
        for side in rounds.values():
            for one in side:
                for problem in one.problems:
                    report.note(f"{kind}: {problem}")
        report.details.append(bench_e2e.commandstats_report(kind, rounds))
    park = bench_e2e.celery_park(url, s.e2e_celery, s.park_rounds)
    report.add(f"12. Celery apply_async(eta=+60 s) us/msg, no worker running ({s.e2e_celery:,} a side)",
               park["celery_park_us_ours"], park["celery_park_us_native"], "celery_park_ratio",
               park["celery_park_ratio"])  # fmt: skip
    park = bench_e2e.park_concurrent(url, s.park_threads, s.park_per_thread, s.park_rounds)
    report.add(
        f"13. {s.park_threads} threads parking at once (delay=1h), us/msg ({s.park_threads * s.park_per_thread:,} "
        f"per round, {s.park_rounds} rounds)",
        park["park_concurrent_us_ours"],
        park["park_concurrent_us_native"],
        "park_ratio_concurrent",
        park["park_ratio_concurrent"],
    )
    for kind, name in (("dramatiq", "import_rss_mb"), ("celery", "import_rss_mb_celery")):
        weight = bench_e2e.import_rss(url, kind)
        what = "DelayMiddleware" if kind == "dramatiq" else "delay_broker's transport"
        report.add(f"14. {kind.capitalize()} worker RSS MB before any message, with {what} vs without",
                   weight["with_mb"], weight["without_mb"], name, weight["delta_mb"])  # fmt: skip
        report.values[f"{name}_extra_modules"] = weight["extra_modules"]
        report.note(f"{kind} worker: packages only delay_broker's imports: {', '.join(weight['packages'])}")


RUNNERS: dict[str, Callable[[Report, Sizes, dict[str, Any]], None]] = {
    "drain": run_drain,
    "scale": run_scale,
    "publish": run_publish,
    "park": run_park,
    "lateness": run_lateness,
    "rss": run_rss,
    "memory": run_memory,
    "tier": run_tier,
    "idle": run_idle,
    "competitor": run_competitor,
    "e2e": run_e2e,
}


def _interrupted(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=sorted(SCALES), default="default")
    parser.add_argument("--only", default=",".join(MEASURES), help=f"comma-separated subset of {','.join(MEASURES)}")
    parser.add_argument("--no-results", action="store_true", help="do not write RESULTS.md and results.png")
    parser.add_argument("--redis-server", help="the redis-server binary to measure on (default: the one on the PATH)")
    parser.add_argument("--repeat", type=int, default=1, help="run the chosen measures N times: median, min, max")
    parser.add_argument("--commandstats", action="store_true", help="e2e: print INFO commandstats per side and phase")
    for field in fields(Sizes):
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=type(getattr(SCALES["default"], field.name)))
    options = parser.parse_args(argv)
    sizes = SCALES[options.scale]
    overrides = {f.name: getattr(options, f.name) for f in fields(Sizes) if getattr(options, f.name) is not None}
    sizes = replace(sizes, **overrides)
    only = [name.strip() for name in options.only.split(",") if name.strip()]
    unknown = set(only) - set(MEASURES)
    if unknown:
        parser.error(f"unknown measures: {', '.join(sorted(unknown))}")
    command = "python -m benchmarks " + shlex.join(argv if argv is not None else sys.argv[1:])

    # SIGTERM (a killed run) unwinds like Ctrl-C, so the servers below are stopped rather than left running.
    signal.signal(signal.SIGTERM, _interrupted)
    report = Report()
    began = time.monotonic()
    load = load_average()
    print(f"delay_broker benchmarks, scale {options.scale}: {json.dumps(sizes.__dict__)}; load {load}", flush=True)
    needs = {"need_rabbit": "publish" in only, "need_sqs": "publish" in only, "need_postgres": "tier" in only}
    with servers(**needs, redis_server=options.redis_server) as env:
        print(f"servers ready after {time.monotonic() - began:.0f} s", flush=True)
        for run in range(options.repeat):
            if options.repeat > 1:
                print(f"-- run {run + 1} of {options.repeat}", flush=True)
            for name in MEASURES:
                if name in only:
                    report.section = E2E if name == "e2e" else MAIN
                    RUNNERS[name](report, sizes, env)
    elapsed = time.monotonic() - began
    print(f"\ndelay_broker side by side, scale {options.scale}, {elapsed / 60:.1f} min, load {load_average()}\n")
    if options.commandstats:
        print("\n\n".join(report.details), end="\n\n")
    print(report.table())
    for note in report.notes_of():
        print(f"note: {note}")
    print()
    print(report.name_values())
    if not options.no_results:
        run_info = RunInfo(command.strip(), options.scale, elapsed, options.repeat, load, options.redis_server)
        chart = None
        if MAIN in report.sections():
            from .chart import draw

            latest = {series.label: series for series in report.lateness}  # a repeated run: its last samples
            chart = draw(list(latest.values()), report.rates, HERE / "results.png")
        path = write_results(report, run_info, chart)
        print(f"\nwrote {path}" + (f" and {chart}" if chart else ""))


if __name__ == "__main__":
    main()
