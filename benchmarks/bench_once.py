"""What effectively-once execution costs (delay_broker.once, OnceMiddleware), against the same work without it.

    python benchmarks/bench_once.py [--messages N] [--records N] [--rounds R]

Starts a private redis-server, measures, and prints a table followed by ``name=value`` lines:

- once_us_per_message: the records of one promoted delivery (``Executions.begin`` before the body, ``end`` after:
  ``SET NX PX`` and ``SET PX``, two round trips), µs per message, one thread on loopback;
  once_floor_us: the same two commands sent with bare redis-py (the least they can cost).
- once_bytes_per_record: Redis memory per record kept for the window (uuid ids, a namespace of 7 characters).
- once_stub_ratio: promoted messages per second through a Dramatiq worker (StubBroker, 8 threads, an actor
  that does nothing) with OnceMiddleware, over the same messages without it (``once_stub_rate``,
  ``once_stub_rate_without``). The broker is in memory: the worst case, the records are all there is to do.
- once_rabbitmq_ratio: the same through a private RabbitMQ node (``RabbitmqBroker``, the messages published
  beforehand), where each message also costs the broker's delivery and acknowledgement;
  once_rabbitmq_5ms_ratio: with an actor that waits 5 ms (I/O, as most actors do something).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import dramatiq
import redis
from dramatiq.brokers.stub import StubBroker

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_core import settle
from delay_broker import DelayStore
from delay_broker.dramatiq import OnceMiddleware
from delay_broker.embedded import EmbeddedRedis
from delay_broker.once import PROMOTION_MARK, Executions


def records_us(store: DelayStore, count: int) -> float:
    executions = Executions(store)
    ids = [str(uuid.uuid4()) for _ in range(count)]
    started = time.perf_counter()
    for id in ids:
        executions.end(executions.begin(id, "1795000000000", 0), succeeded=True)
    return (time.perf_counter() - started) / count * 1e6


def floor_us(client: redis.Redis, count: int) -> float:
    keys = [f"floor:{uuid.uuid4()}" for _ in range(count)]
    started = time.perf_counter()
    for key in keys:
        client.set(key, b"r", nx=True, px=3_600_000)
        client.set(key, b"d", px=3_600_000)
    elapsed = time.perf_counter() - started
    for start in range(0, count, 1000):
        client.delete(*keys[start : start + 1000])
    return elapsed / count * 1e6


def bytes_per_record(client: redis.Redis, count: int) -> float:
    store = DelayStore(client, namespace=f"once-{uuid.uuid4().hex[:2]}")
    executions = Executions(store)
    before = int(client.info("memory")["used_memory"])
    for _ in range(count):
        executions.end(executions.begin(str(uuid.uuid4()), "1795000000000", 0), succeeded=True)
    after = int(client.info("memory")["used_memory"])
    for key in client.scan_iter(store.keys.key("once:*"), count=1000):
        client.unlink(key)
    settle(client, before)
    return (after - before) / count


def worker_rate(
    client: redis.Redis, count: int, once: bool, rabbitmq_url: str | None = None, work_s: float = 0.0
) -> float:
    """Messages per second a Dramatiq worker runs, each marked as promoted (on a StubBroker, or RabbitMQ)."""
    broker: dramatiq.Broker
    if rabbitmq_url is None:
        broker = StubBroker()
    else:
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        broker = RabbitmqBroker(url=rabbitmq_url)
    broker.emit_after("process_boot")
    if once:
        broker.add_middleware(OnceMiddleware(store=DelayStore(client, namespace=f"w-{uuid.uuid4().hex[:6]}")))
    done: list[int] = []

    @dramatiq.actor(broker=broker, queue_name=f"bench{uuid.uuid4().hex[:8]}", actor_name="noop")
    def noop(n: int) -> None:
        if work_s:
            time.sleep(work_s)
        done.append(n)

    for n in range(count):
        message = noop.message_with_options(args=(n,))
        message.options[PROMOTION_MARK] = "1795000000000"
        broker.enqueue(message)
    worker = dramatiq.Worker(broker, worker_threads=8, worker_timeout=50)
    started = time.perf_counter()
    worker.start()
    while len(done) < count:
        time.sleep(0.005)
    elapsed = time.perf_counter() - started
    worker.stop()
    broker.close()  # a RabbitMQ queue is left to the private node, stopped at the end
    return count / elapsed


def ratios(
    client: redis.Redis, count: int, rounds: int, rabbitmq_url: str | None = None, work_s: float = 0.0
) -> tuple[float, float, float]:
    """Median rates with and without OnceMiddleware, and their ratio: rounds alternate which side goes first."""
    rates: dict[bool, list[float]] = {True: [], False: []}
    for turn in range(rounds):
        for once in (True, False) if turn % 2 == 0 else (False, True):
            rates[once].append(worker_rate(client, count, once, rabbitmq_url, work_s))
    with_once, without = statistics.median(rates[True]), statistics.median(rates[False])
    return with_once, without, with_once / without


def main() -> None:
    from integration.servers import RabbitNode

    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rabbitmq-messages", type=int, default=5_000)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    figures: dict[str, float] = {}
    with EmbeddedRedis() as server:
        client: Any = server.client()
        store = DelayStore(client, namespace="bench-once")
        ours, floor = [], []
        for turn in range(options.rounds):
            # Interleaved, and each side first in turn: a noisy machine hits both alike.
            if turn % 2 == 0:
                ours.append(records_us(store, options.messages))
            floor.append(floor_us(client, options.messages))
            if turn % 2 == 1:
                ours.append(records_us(store, options.messages))
        figures["once_us_per_message"] = round(statistics.median(ours), 1)
        figures["once_floor_us"] = round(statistics.median(floor), 1)
        figures["once_bytes_per_record"] = round(bytes_per_record(client, options.records), 1)
        with_once, without, ratio = ratios(client, options.messages, options.rounds)
        figures |= {"once_stub_rate": round(with_once), "once_stub_rate_without": round(without)}
        figures["once_stub_ratio"] = round(ratio, 3)
        rabbit = RabbitNode()
        try:
            rabbit.start()
            for name, work_s in (("once_rabbitmq", 0.0), ("once_rabbitmq_5ms", 0.005)):
                with_once, without, ratio = ratios(
                    client, options.rabbitmq_messages, options.rounds, rabbit.pika_url, work_s
                )
                figures |= {f"{name}_rate": round(with_once), f"{name}_rate_without": round(without)}
                figures[f"{name}_ratio"] = round(ratio, 3)
        finally:
            rabbit.close()
    print(f"{'measure':<28} value")
    for name, value in figures.items():
        print(f"{name:<28} {value}")
    for name, value in figures.items():
        print(f"{name}={value}")


if __name__ == "__main__":
    main()
