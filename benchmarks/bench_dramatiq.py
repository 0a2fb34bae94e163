"""Dramatiq side by side: drain into RedisBroker vs a bare Lua move, promotion into RabbitMQ/SQS vs direct
publishing, parking vs native delayed sends, lateness and worker memory with real ``dramatiq`` workers."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker

from delay_broker import DelayStore, Envelope, ParkRequest
from delay_broker.dramatiq import DelayMiddleware, build_promoter

from .apps.dramatiq_app import declare_probe
from .common import (
    HERE,
    Lateness,
    WorkerProcess,
    delete_store,
    median,
    now_ms,
    python_command,
    read_json_list,
    read_records,
    wait_for,
)

QUEUE = "bench"


@dataclass(frozen=True)
class Prepared:
    """A Dramatiq message as DelayMiddleware.park stores it: id, envelope, and its bytes for the reference."""

    message_id: str
    hash_field: str | None
    payload: bytes
    envelope: Envelope


def prepare(actor: dramatiq.Actor[Any, Any], count: int, *, redis_ids: bool) -> list[Prepared]:
    """``count`` messages of ``actor`` encoded exactly as the middleware parks them (canonical queue, no eta,
    a fresh ``redis_message_id`` on a RedisBroker)."""
    prepared = []
    for n in range(count):
        message = actor.message(n)
        options = dict(message.options)
        if redis_ids:
            options["redis_message_id"] = str(uuid.uuid4())
        message = message.copy(options=options)
        payload = message.encode()
        field = options.get("redis_message_id")
        envelope = Envelope(
            route=message.queue_name, payload=payload, framework="dramatiq", name=message.actor_name, hash_field=field
        )
        prepared.append(Prepared(message.message_id, field, payload, envelope))
    return prepared


def park_due_now(store: DelayStore, messages: list[Prepared]) -> None:
    store.park_many([ParkRequest(m.message_id, m.envelope, delay=0) for m in messages])


def redis_setup(url: str, namespace: str) -> tuple[RedisBroker, DelayMiddleware, dramatiq.Actor[Any, Any]]:
    broker = RedisBroker(url=url, namespace=namespace)
    middleware = DelayMiddleware(threshold=0, namespace=namespace, promote_in_workers=False)
    broker.add_middleware(middleware)
    actor = dramatiq.actor(broker=broker, queue_name=QUEUE, actor_name="probe")(lambda n: None)
    return broker, middleware, actor


def drain_promoter(broker: dramatiq.Broker, count: int, batch: int) -> float:
    """Seconds for the adapter's own promoter (build_promoter) to move ``count`` due messages."""
    promoter = build_promoter(broker, batch=batch)
    started = time.perf_counter()
    while promoter.counters.promoted + promoter.counters.dead_lettered < count:
        promoter.step()
        if time.perf_counter() - started > 600:
            raise TimeoutError(f"only {promoter.counters.promoted} of {count} promoted in 600 s")
    elapsed = time.perf_counter() - started
    if promoter.counters.dead_lettered:
        raise RuntimeError(f"{promoter.counters.dead_lettered} messages dead-lettered during the drain")
    return elapsed


# -- 1. drain_ratio -----------------------------------------------------------------------------------------------


def drain_ratio(url: str, count: int, batch: int, rounds: int) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    move = client.register_script((HERE / "dramatiq_move.lua").read_text())
    ours: list[float] = []
    bare: list[float] = []
    _, _, template_actor = redis_setup(url, "template")
    messages = prepare(template_actor, count, redis_ids=True)

    def run_ours() -> None:
        namespace = f"drain-{uuid.uuid4().hex[:6]}"
        broker, middleware, _ = redis_setup(url, namespace)
        park_due_now(middleware.store, messages)
        ours.append(count / drain_promoter(broker, count, batch))
        assert client.llen(f"{namespace}:{QUEUE}") == count == client.hlen(f"{namespace}:{QUEUE}.msgs")
        client.delete(f"{namespace}:{QUEUE}", f"{namespace}:{QUEUE}.msgs")
        delete_store(middleware.store)

    def run_bare() -> None:
        prefix = f"bare-{uuid.uuid4().hex[:6]}"
        keys = [f"{prefix}:due", f"{prefix}:msg", f"{prefix}:{QUEUE}", f"{prefix}:{QUEUE}.msgs"]
        score = int(time.time() * 1000) * 1024
        for start in range(0, count, 1000):
            pipe = client.pipeline(transaction=False)
            chunk = messages[start : start + 1000]
            pipe.zadd(keys[0], {m.hash_field: score for m in chunk})  # type: ignore[misc]
            pipe.hset(keys[1], mapping={m.hash_field: m.payload for m in chunk})  # type: ignore[misc]
            pipe.execute()
        started = time.perf_counter()
        while move(keys=keys, args=[batch]):
            pass
        bare.append(count / (time.perf_counter() - started))
        assert client.llen(keys[2]) == count == client.hlen(keys[3])
        client.delete(*keys)

    for n in range(rounds):
        # Interleaved, alternating which goes first, so machine noise hits both alike.
        for run in (run_ours, run_bare) if n % 2 == 0 else (run_bare, run_ours):
            run()
    client.close()
    return {
        "drain_msgs_per_s": max(ours),
        "drain_bare_msgs_per_s": max(bare),
        "drain_ratio": max(ours) / max(bare),
        "drain_rounds_ours": ours,
        "drain_rounds_bare": bare,
    }


# -- 7. scale_ratio -----------------------------------------------------------------------------------------------


def scale_ratio(url: str, parked: int, due: int, batch: int, rounds: int) -> dict[str, Any]:
    """Drain rate of ``due`` due messages alone vs with ``parked - due`` far-future messages beside them."""
    client = redis.Redis.from_url(url)
    small_ns, large_ns = f"scale-s-{uuid.uuid4().hex[:6]}", f"scale-l-{uuid.uuid4().hex[:6]}"
    small, _, actor = redis_setup(url, small_ns)
    large, large_mw, _ = redis_setup(url, large_ns)
    filler_count = max(0, parked - due)
    started = time.perf_counter()
    step = 20_000
    for start in range(0, filler_count, step):
        chunk = prepare(actor, min(step, filler_count - start), redis_ids=True)
        # Far future: spread over the next 30 days, so the ZSET is realistic rather than one score.
        large_mw.store.park_many(
            [ParkRequest(m.message_id, m.envelope, delay=86_400 + (n * 7919) % 2_500_000) for n, m in enumerate(chunk)]
        )
    filled_in = time.perf_counter() - started
    memory_mb = int(client.info("memory")["used_memory"]) / 1e6
    rates: dict[str, list[float]] = {"small": [], "large": []}
    for n in range(rounds):
        for label in ("small", "large") if n % 2 == 0 else ("large", "small"):
            broker = small if label == "small" else large
            messages = prepare(actor, due, redis_ids=True)
            store = DelayStore(client, namespace=small_ns if label == "small" else large_ns)
            park_due_now(store, messages)
            rates[label].append(due / drain_promoter(broker, due, batch))
            namespace = small_ns if label == "small" else large_ns
            client.delete(f"{namespace}:{QUEUE}", f"{namespace}:{QUEUE}.msgs")
    remaining = DelayStore(client, namespace=large_ns).stats().parked
    for namespace in (small_ns, large_ns):
        delete_store(DelayStore(client, namespace=namespace))
    client.close()
    return {
        "scale_parked": parked,
        "scale_due": due,
        "scale_fill_s": filled_in,
        "scale_redis_mb": memory_mb,
        "scale_far_future_left": remaining,
        "scale_small_msgs_per_s": median(rates["small"]),
        "scale_large_msgs_per_s": median(rates["large"]),
        "scale_ratio": median(rates["large"]) / median(rates["small"]),
    }


# -- 2. publish_ratio (RabbitMQ, SQS) -------------------------------------------------------------------------------


def publish_ratio(
    make_broker: Callable[[], dramatiq.Broker], store_url: str, count: int, batch: int, rounds: int
) -> dict[str, Any]:
    """Promotion through the at-least-once BrokerDeliverer vs ``broker.enqueue`` of the same messages."""
    broker = make_broker()
    namespace = f"pub-{uuid.uuid4().hex[:6]}"
    middleware = DelayMiddleware(redis_url=store_url, threshold=0, namespace=namespace, promote_in_workers=False)
    broker.add_middleware(middleware)

    def fresh_actor() -> dramatiq.Actor[Any, Any]:
        # A new queue for every run: moto's SendMessage slows down as a queue grows, and it allows one
        # PurgeQueue per minute; RabbitMQ does not care either way.
        queue = f"bench_{uuid.uuid4().hex[:8]}"
        return dramatiq.actor(broker=broker, queue_name=queue, actor_name=f"probe_{queue}")(lambda n: None)

    # Warm up both paths (connections, queue creation) before timing anything.
    warm = prepare(fresh_actor(), 20, redis_ids=False)
    park_due_now(middleware.store, warm)
    drain_promoter(broker, len(warm), batch)
    for m in warm:
        broker.enqueue(dramatiq.Message.decode(m.payload))
    ours: list[float] = []
    direct: list[float] = []

    def run_ours() -> None:
        messages = prepare(fresh_actor(), count, redis_ids=False)
        park_due_now(middleware.store, messages)
        ours.append(count / drain_promoter(broker, count, batch))

    def run_direct() -> None:
        decoded = [dramatiq.Message.decode(m.payload) for m in prepare(fresh_actor(), count, redis_ids=False)]
        started = time.perf_counter()
        for message in decoded:
            broker.enqueue(message)
        direct.append(count / (time.perf_counter() - started))

    for n in range(rounds):
        for run in (run_ours, run_direct) if n % 2 == 0 else (run_direct, run_ours):
            run()
    stats = middleware.store.stats()
    assert stats.parked == stats.inflight == stats.dead == 0, stats
    delete_store(middleware.store)
    broker.close()
    return {"ours": max(ours), "direct": max(direct), "ratio": max(ours) / max(direct)}


# -- 3. park_ratio --------------------------------------------------------------------------------------------------


def park_ratio(url: str, count: int, rounds: int) -> dict[str, Any]:
    """``send_with_options(delay=1 h)`` through DelayMiddleware vs plain RedisBroker, per message."""
    ours_broker = RedisBroker(url=url, namespace=f"park-o-{uuid.uuid4().hex[:6]}")
    ours_broker.add_middleware(DelayMiddleware(threshold=60, namespace="park", promote_in_workers=False))
    native_broker = RedisBroker(url=url, namespace=f"park-n-{uuid.uuid4().hex[:6]}")
    ours_actor = dramatiq.actor(broker=ours_broker, queue_name=QUEUE, actor_name="probe")(lambda n: None)
    native_actor = dramatiq.actor(broker=native_broker, queue_name=QUEUE, actor_name="probe")(lambda n: None)
    hour = 3_600_000
    for actor in (ours_actor, native_actor):
        for n in range(50):
            actor.send_with_options(args=(n,), delay=hour)
    spent = {"ours": 0.0, "native": 0.0}
    chunk = 500
    per_round = max(chunk, count // rounds)
    for n in range(rounds):
        for start in range(0, per_round, chunk):
            pairs = [("ours", ours_actor), ("native", native_actor)]
            for label, actor in pairs if (n + start // chunk) % 2 == 0 else pairs[::-1]:
                began = time.perf_counter()
                for i in range(chunk):
                    actor.send_with_options(args=(i,), delay=hour)
                spent[label] += time.perf_counter() - began
    sent = rounds * ((per_round + chunk - 1) // chunk) * chunk
    client = redis.Redis.from_url(url)
    parked = DelayStore(client, namespace="park").stats().parked
    assert parked == sent + 50, (parked, sent)
    delete_store(DelayStore(client, namespace="park"))
    for key in client.scan_iter(match=f"{native_broker.namespace}:*"):
        client.delete(key)
    client.close()
    ours_us, native_us = spent["ours"] / sent * 1e6, spent["native"] / sent * 1e6
    return {"park_us": ours_us, "park_native_us": native_us, "park_ratio": ours_us / native_us, "park_sent": sent}


# -- 4. lateness with a real worker ---------------------------------------------------------------------------------


def worker_env(url: str, mode: str, namespace: str) -> dict[str, str]:
    return {
        "BENCH_REDIS_URL": url,
        "BENCH_NS": namespace,
        "BENCH_MODE": mode,
        "BENCH_QUEUE": QUEUE,
        "BENCH_RECORDS": f"{namespace}:records",
        "BENCH_PROMOTER": f"{namespace}:promoter",
    }


def start_worker(env: dict[str, str], name: str, threads: int = 8) -> WorkerProcess:
    command = python_command(
        "-m", "dramatiq", "benchmarks.apps.dramatiq_app:broker", "--processes", "1", "--threads", str(threads)
    )
    worker = WorkerProcess(command, env, name)
    worker.wait_ready("ready for action", f"dramatiq worker {name} booted")
    return worker


def producer(env: dict[str, str]) -> tuple[dramatiq.Broker, dramatiq.Actor[Any, Any]]:
    broker = RedisBroker(url=env["BENCH_REDIS_URL"], namespace=env["BENCH_NS"])
    if env["BENCH_MODE"] == "ours":
        broker.add_middleware(DelayMiddleware(threshold=0, namespace=env["BENCH_NS"], promote_in_workers=False))
    return broker, declare_probe(broker, QUEUE)


def send_schedule(send: Callable[[float, int], None], rate: int, seconds: float, lead_s: float) -> tuple[int, int]:
    """Sends ``rate * seconds`` messages due ``1/rate`` s apart from ``lead_s`` s on, in due order, as fast as
    the producer can (it runs ahead of the due times). Returns (sent, sent too late to be delayed)."""
    count = int(rate * seconds)
    first = now_ms() + lead_s * 1000
    late = 0
    for n in range(count):
        due = first + n * 1000.0 / rate
        delay = math.ceil(due - now_ms())
        if delay < 1:
            late += 1
        send(due, max(1, delay))
    return count, late


def lateness(url: str, mode: str, rate: int, seconds: float, lead_s: float) -> tuple[Lateness, Lateness | None, int]:
    namespace = f"lat-{mode}-{uuid.uuid4().hex[:6]}"
    env = worker_env(url, mode, namespace)
    client = redis.Redis.from_url(url)
    worker = start_worker(env, f"dramatiq-{mode}")
    try:
        broker, actor = producer(env)
        time.sleep(1.0)
        count, late = send_schedule(
            lambda due, delay: actor.send_with_options(args=(due,), delay=delay), rate, seconds, lead_s
        )
        wait_for(
            lambda: client.llen(env["BENCH_RECORDS"]) >= count,
            lead_s + seconds + 60,
            f"{count} dramatiq ({mode}) messages ran",
            interval=0.5,
        )
        time.sleep(0.5)
    finally:
        worker.stop()
        worker.close()
    label = "delay_broker + Dramatiq" if mode == "ours" else "native Dramatiq"
    e2e = Lateness(label, [started - due for due, started in read_records(client, env["BENCH_RECORDS"])], count)
    promoter = None
    if mode == "ours":
        promoter = Lateness("promotion step (Dramatiq)", read_json_list(client, env["BENCH_PROMOTER"]), count)
        delete_store(DelayStore(client, namespace=namespace))
    for key in client.scan_iter(match=f"{namespace}:*"):
        client.delete(key)
    broker.close()
    client.close()
    return e2e, promoter, late


# -- 5. worker memory -----------------------------------------------------------------------------------------------


def worker_rss(url: str, mode: str, count: int) -> dict[str, float]:
    """RSS of a 1-process, 8-thread worker before and after ``count`` messages delayed 1 h are sent.

    Native Dramatiq pulls delayed messages into the worker and holds them until due, up to its delay prefetch
    (threads x 1000 by default); it is raised to ``count`` here so the worker holds them all, as it would with
    enough threads or processes.
    """
    namespace = f"rss-{mode}-{uuid.uuid4().hex[:6]}"
    env = worker_env(url, mode, namespace)
    env["dramatiq_delay_queue_prefetch"] = str(count)
    client = redis.Redis.from_url(url)
    worker = start_worker(env, f"dramatiq-rss-{mode}")
    try:
        broker, actor = producer(env)
        time.sleep(3.0)
        before = worker.rss_mb()
        for n in range(count):
            actor.send_with_options(args=(n,), delay=3_600_000)
        if mode == "native":
            wait_for(
                lambda: client.llen(f"{namespace}:{QUEUE}.DQ") == 0, 300, "the worker pulled every delayed message"
            )
        time.sleep(3.0)
        after = worker.rss_mb()
        held = count - int(client.llen(f"{namespace}:{QUEUE}.DQ"))
    finally:
        worker.stop()
        worker.close()
    if mode == "ours":
        store = DelayStore(client, namespace=namespace)
        delete_store(store)
        held = 0
    for key in client.scan_iter(match=f"{namespace}:*"):
        client.delete(key)
    broker.close()
    client.close()
    return {"before_mb": before, "after_mb": after, "growth_mb": after - before, "held": held}
