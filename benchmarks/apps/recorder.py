"""What the e2e measure's worker processes report: when each task ran, and what the process sent to Redis.

A task's record is kept in memory and pushed with the others every ``every`` seconds (one RPUSH of many values
on a connection the counters leave out), so recording costs Redis almost nothing beside what the two sides do.
The same flush publishes the process's command counts (:mod:`benchmarks.counting`) under its pid.

Environment (both apps):
  BENCH_E2E_RECORDS   list the records ``"n,due_ms,started_ms"`` are pushed to (turns the recorder on)
  BENCH_E2E_COUNTS    hash: pid -> JSON counts of what this process sent to Redis (commands, round trips, bytes)
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict

import redis

from benchmarks import counting


class Recorder:
    def __init__(self, url: str, records: str, counts: str, every: float = 0.1) -> None:
        counting.install()
        self.client = counting.uncounted_client(url)
        self.records = records
        self.counts = counts
        self.every = every
        self._pending: list[str] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._loop, name="bench-recorder", daemon=True).start()

    def record(self, n: int, due_ms: float) -> None:
        started = time.time() * 1000.0
        with self._lock:
            self._pending.append(f"{n},{due_ms},{started}")

    def _loop(self) -> None:
        while True:
            time.sleep(self.every)
            # Redis gone (the benchmark is ending): try again at the next tick; the thread dies with the process.
            with contextlib.suppress(redis.RedisError):
                self.flush()

    def flush(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
        try:
            pipe = self.client.pipeline(transaction=False)
            if batch:
                pipe.rpush(self.records, *batch)
            pipe.hset(self.counts, str(os.getpid()), json.dumps(asdict(counting.counts())))
            pipe.execute()
        except redis.RedisError:
            with self._lock:
                self._pending[:0] = batch
            raise


def from_env(env: Mapping[str, str]) -> Recorder | None:
    if "BENCH_E2E_RECORDS" not in env:
        return None
    return Recorder(env["BENCH_REDIS_URL"], env["BENCH_E2E_RECORDS"], env["BENCH_E2E_COUNTS"])
