"""What the e2e measure reads around a run: process CPU from /proc, ``INFO commandstats`` and network bytes of the
redis-server, and the command counts the producer and the worker sent (:mod:`benchmarks.counting`)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import redis

from . import counting
from .counting import Counts

TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str]:
    # The command name (field 2) may hold spaces and parentheses: the fields after it follow the last ")".
    text = Path(f"/proc/{pid}/stat").read_text()
    return text.rsplit(")", 1)[1].split()


def process_cpu_s(pid: int, *, children: bool = False) -> float:
    """utime + stime of a process (all its threads), from /proc/<pid>/stat; with ``children``, plus the live
    processes under it and the reaped ones (cutime + cstime)."""
    fields = _stat_fields(pid)  # fields[0] is field 3 (state): utime is field 14, stime 15, cutime 16, cstime 17
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
        with contextlib.suppress(psutil.NoSuchProcess):
            for child in psutil.Process(pid).children(recursive=True):
                with contextlib.suppress(OSError):
                    child_fields = _stat_fields(child.pid)
                    ticks += int(child_fields[11]) + int(child_fields[12])
    return ticks / TICKS


def server_pid(process_pid: int) -> int:
    """The redis-server's pid: the process EmbeddedRedis started (``setpriv`` execs it, so the same pid), or the
    one child of it that is a redis-server."""
    if Path(f"/proc/{process_pid}/comm").read_text().strip().startswith("redis-server"):
        return process_pid
    for child in psutil.Process(process_pid).children(recursive=True):
        if child.name().startswith("redis-server"):
            return child.pid
    raise RuntimeError(f"no redis-server process at or under pid {process_pid}")


def commandstats(client: redis.Redis) -> dict[str, tuple[int, int]]:
    """command -> (calls, usec), ``INFO commandstats``."""
    stats = client.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): (int(value["calls"]), int(value["usec"]))
        for name, value in stats.items()
        if isinstance(value, dict)
    }


def worker_counts(client: redis.Redis, key: str) -> Counts:
    total = Counts()
    for raw in client.hvals(key):
        total = total + Counts(**json.loads(raw))
    return total


@dataclass
class Snapshot:
    """One reading of everything a window is the difference of."""

    redis_cpu_s: float
    worker_cpu_s: float
    stats: dict[str, tuple[int, int]]
    net_in: int
    net_out: int
    producer: Counts
    worker: Counts
    own_llen: int
    at: float = field(default_factory=time.monotonic)

    @classmethod
    def take(cls, watch: Watch) -> Snapshot:
        client = watch.client
        net = client.info("stats")
        return cls(
            process_cpu_s(watch.redis_pid),
            process_cpu_s(watch.worker_pid, children=True),
            commandstats(client),
            int(net["total_net_input_bytes"]),
            int(net["total_net_output_bytes"]),
            counting.counts(),
            worker_counts(client, watch.counts_key),
            watch.own_llen,
        )


# Commands only the benchmark sends, to read the figures (on its uncounted client): left out of every total.
OWN = ("info", "hvals")


@dataclass
class Watch:
    """The benchmark's view of one run: its uncounted client, the processes, the keys the worker reports to."""

    client: redis.Redis
    redis_pid: int
    worker_pid: int
    counts_key: str
    records_key: str
    own_llen: int = 0

    def recorded(self) -> int:
        """Tasks recorded so far (LLEN, which scripts use too: counted, and taken off the window's stats)."""
        self.own_llen += 1
        return int(self.client.llen(self.records_key))


@dataclass
class Window:
    """What happened on Redis between two snapshots."""

    seconds: float
    redis_cpu_s: float
    worker_cpu_s: float
    stats: dict[str, tuple[int, int]]
    net_in: int
    net_out: int
    producer: Counts
    worker: Counts

    @classmethod
    def between(cls, first: Snapshot, last: Snapshot) -> Window:
        stats = {}
        for name, (calls, usec) in last.stats.items():
            before = first.stats.get(name, (0, 0))
            if name == "llen":
                calls -= last.own_llen - first.own_llen
            if calls - before[0] and name not in OWN:
                stats[name] = (calls - before[0], usec - before[1])
        return cls(
            last.at - first.at,
            last.redis_cpu_s - first.redis_cpu_s,
            last.worker_cpu_s - first.worker_cpu_s,
            stats,
            last.net_in - first.net_in,
            last.net_out - first.net_out,
            last.producer - first.producer,
            last.worker - first.worker,
        )

    def minus(self, part: Window) -> Window:
        """This window without ``part`` (one that began with it): what happened after ``part`` ended."""
        stats = {}
        for name, (calls, usec) in self.stats.items():
            before = part.stats.get(name, (0, 0))
            if calls - before[0]:
                stats[name] = (calls - before[0], usec - before[1])
        return Window(
            self.seconds - part.seconds,
            self.redis_cpu_s - part.redis_cpu_s,
            self.worker_cpu_s - part.worker_cpu_s,
            stats,
            self.net_in - part.net_in,
            self.net_out - part.net_out,
            self.producer - part.producer,
            self.worker - part.worker,
        )

    @property
    def clients(self) -> Counts:
        return self.producer + self.worker

    @property
    def script_calls(self) -> int:
        return sum(self.stats.get(name, (0, 0))[0] for name in ("evalsha", "eval", "fcall"))

    @property
    def in_scripts(self) -> int:
        """Commands Redis ran inside scripts: every command it counted, less those clients sent."""
        return sum(calls for calls, _ in self.stats.values()) - self.clients.commands


def merge(windows: list[Window]) -> dict[str, tuple[int, int]]:
    """commandstats of several windows added up."""
    total: dict[str, tuple[int, int]] = {}
    for window in windows:
        for name, (calls, usec) in window.stats.items():
            before = total.get(name, (0, 0))
            total[name] = (before[0] + calls, before[1] + usec)
    return total


def stats_table(title: str, ours: list[Window], native: list[Window]) -> str:
    """Per command, calls and usec of ours and native added over ``ours``/``native`` (one window per round)."""
    mine, theirs = merge(ours), merge(native)
    names = sorted(set(mine) | set(theirs), key=lambda name: -(mine.get(name, (0, 0))[1] + theirs.get(name, (0, 0))[1]))
    lines = [
        f"{title} ({len(ours)} + {len(native)} rounds; commands run by scripts are counted under their names too)",
        f"  {'command':<12} {'ours calls':>11} {'ours usec':>10} {'us/call':>8} "
        f"{'native calls':>13} {'native usec':>11} {'us/call':>8}",
    ]
    for name in names:
        a, b = mine.get(name, (0, 0)), theirs.get(name, (0, 0))
        lines.append(
            f"  {name:<12} {a[0]:>11,} {a[1]:>10,} {a[1] / a[0] if a[0] else 0:>8.2f} "
            f"{b[0]:>13,} {b[1]:>11,} {b[1] / b[0] if b[0] else 0:>8.2f}"
        )
    for label, pick in (
        ("client commands", lambda w: w.clients.commands),
        ("client round trips", lambda w: w.clients.round_trips),
        ("client bytes out", lambda w: w.clients.bytes_out),
        ("commands in scripts", lambda w: w.in_scripts),
        ("server net in bytes", lambda w: w.net_in),
        ("server net out bytes", lambda w: w.net_out),
        ("redis-server CPU ms", lambda w: round(w.redis_cpu_s * 1000)),
        ("worker CPU ms", lambda w: round(w.worker_cpu_s * 1000)),
    ):
        mine_total, theirs_total = sum(pick(w) for w in ours), sum(pick(w) for w in native)
        lines.append(f"  {label:<22} ours {mine_total:>12,}   native {theirs_total:>12,}")
    return "\n".join(lines)
