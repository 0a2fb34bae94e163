"""Helpers shared by the side-by-side benchmarks: statistics, worker processes, process-tree memory."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import redis

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent


def delete_store(store: Any) -> None:
    """Delete every key of a store's namespace, its packs and packed index included (``keys.all()`` names only
    the fixed ones), shard by shard."""
    for space in store.shards:
        keys = list(store.client.scan_iter(match=space.pattern, count=1000))
        for start in range(0, len(keys), 1000):
            store.client.delete(*keys[start : start + 1000])


def now_ms() -> float:
    return time.time() * 1000.0


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return float(ordered[min(rank, len(ordered)) - 1])


def median(values: Sequence[float]) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    middle = len(ordered) // 2
    return float(ordered[middle]) if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2.0


@dataclass
class Lateness:
    """Lateness samples (ms) of one path, for the table and the chart."""

    label: str
    samples: list[float] = field(default_factory=list)
    expected: int = 0

    @property
    def p50(self) -> float:
        return percentile(self.samples, 50)

    @property
    def p99(self) -> float:
        return percentile(self.samples, 99)

    @property
    def max(self) -> float:
        return max(self.samples) if self.samples else math.nan

    @property
    def min(self) -> float:
        return min(self.samples) if self.samples else math.nan

    @property
    def missing(self) -> int:
        return max(0, self.expected - len(self.samples))


def wait_for(condition: Callable[[], object], timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(interval)


class WorkerProcess:
    """A real ``dramatiq`` or ``celery worker`` process group of ours, with its log in a temporary file."""

    def __init__(self, command: list[str], env: Mapping[str, str], name: str) -> None:
        self.log = Path(tempfile.mkstemp(prefix=f"delay-broker-bench-{name}-", suffix=".log")[1])
        with open(self.log, "ab") as output:
            self.process = subprocess.Popen(
                command,
                cwd=ROOT,
                env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(f"worker exited with {self.process.returncode}:\n{self.text()[-3000:]}")

    def rss_mb(self) -> float:
        """Resident memory of the whole process tree (the CLI parent and its forked workers), in MB."""
        try:
            parent = psutil.Process(self.process.pid)
            processes = [parent, *parent.children(recursive=True)]
        except psutil.NoSuchProcess:
            return math.nan
        total = 0
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                total += process.memory_info().rss
        return total / 1e6

    def stop(self, timeout: float = 30.0) -> None:
        try:
            if self.process.poll() is None:
                # The CLI process only: it forwards the signal to its workers (a second SIGTERM, from a group-wide
                # kill, makes Dramatiq kill them without running their shutdown hooks).
                with contextlib.suppress(ProcessLookupError):
                    self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(timeout)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(self.process.pid, signal.SIGKILL)
                    self.process.wait(10)
        finally:
            # Forked children of a CLI that died first are in the same group, and an interrupted run (Ctrl-C,
            # SIGTERM) may not have waited: make sure none is left.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)

    def close(self) -> None:
        try:
            self.stop()
        finally:
            self.log.unlink(missing_ok=True)

    def wait_ready(self, marker: str, what: str, timeout: float = 90) -> None:
        """Waits for ``marker`` in the log; the process is stopped if it never comes (or the wait is interrupted)."""

        def ready() -> bool:
            self.check_alive()
            return marker in self.text()

        try:
            wait_for(ready, timeout, what)
        except BaseException:
            self.close()
            raise


def python_command(*args: str) -> list[str]:
    return [sys.executable, *args]


def read_records(client: redis.Redis, key: str) -> list[tuple[float, float]]:
    """(due_ms, started_ms) pairs the probe actors/tasks RPUSHed as ``"due,started"``."""
    pairs = []
    for raw in client.lrange(key, 0, -1):
        due, started = raw.decode().split(",")
        pairs.append((float(due), float(started)))
    return pairs


def read_json_list(client: redis.Redis, key: str) -> list[float]:
    values: list[float] = []
    for raw in client.lrange(key, 0, -1):
        values.extend(json.loads(raw))
    return values


def fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)
