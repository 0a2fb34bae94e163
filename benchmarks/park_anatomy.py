"""Where a one-message delayed send's time goes: ours (packed, and in the ordinary layout) against native.

    .venv/bin/python benchmarks/park_anatomy.py [--count 2000] [--rounds 9]

For ``send_with_options(delay=1 h)`` on a RedisBroker, with DelayMiddleware (a pack: ``pack_one.lua``; with
``pack_after=None``: ``park_one.lua``) and without (Dramatiq's own dispatch script), sequential sends from one
thread, sides interleaved round by round, the median over rounds of: wall time per send, the producer's CPU time per
send (Python and its system calls), and the server's time per script call (``INFO commandstats`` usec of EVALSHA,
which counts the script's inner commands in it). Wall minus both is the round trip: the kernel and the switches
between the two processes, alike for every side. ``park_ratio`` of ``python -m benchmarks`` is the first line's
wall against the last's.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from typing import Any

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker

from delay_broker.dramatiq import DelayMiddleware
from delay_broker.embedded import EmbeddedRedis

HOUR_MS = 3_600_000


def actor_of(url: str, store_options: dict[str, Any] | None) -> dramatiq.Actor[Any, Any]:
    """An actor on a broker of its own: with DelayMiddleware (``store_options`` for its store), or native (None)."""
    tag = uuid.uuid4().hex[:6]
    broker = RedisBroker(url=url, namespace=f"anatomy-{tag}")
    if store_options is not None:
        middleware = DelayMiddleware(
            threshold=60, namespace=f"anatomy-{tag}", promote_in_workers=False, store_options=store_options
        )
        broker.add_middleware(middleware)
    return dramatiq.actor(broker=broker, queue_name="q", actor_name="probe")(lambda n: None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=2000, help="sends per side and round")
    parser.add_argument("--rounds", type=int, default=9)
    options = parser.parse_args()
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        sides = {
            "ours, packed (pack_one.lua)": actor_of(server.url, {}),
            "ours, ordinary layout (park_one.lua)": actor_of(server.url, {"pack_after": None}),
            "native (Dramatiq's dispatch script)": actor_of(server.url, None),
        }
        for actor in sides.values():  # connections made, scripts loaded
            for n in range(50):
                actor.send_with_options(args=(n,), delay=HOUR_MS)
        figures: dict[str, list[tuple[float, float, float]]] = {name: [] for name in sides}
        for n in range(options.rounds):
            for name, actor in list(sides.items())[:: 1 if n % 2 == 0 else -1]:
                client.config_resetstat()
                began, cpu = time.perf_counter(), time.process_time()
                for i in range(options.count):
                    actor.send_with_options(args=(i,), delay=HOUR_MS)
                wall = (time.perf_counter() - began) / options.count * 1e6
                producer = (time.process_time() - cpu) / options.count * 1e6
                script = float(client.info("commandstats")["cmdstat_evalsha"]["usec_per_call"])
                figures[name].append((wall, producer, script))
        native = statistics.median(wall for wall, _, _ in figures["native (Dramatiq's dispatch script)"])
        print(f"median of {options.rounds} rounds, {options.count:,} sends a side each, µs per send")
        print(f"{'':38s} {'wall':>7s} {'producer CPU':>13s} {'server (script)':>16s} {'rest':>7s} {'ratio':>6s}")
        for name, rows in figures.items():
            wall, producer, script = (statistics.median(row[k] for row in rows) for k in range(3))
            rest = wall - producer - script
            print(f"{name:38s} {wall:7.1f} {producer:13.1f} {script:16.1f} {rest:7.1f} {wall / native:6.2f}")


if __name__ == "__main__":
    main()
