"""The benchmark's report: a table and ``name=value`` lines, the spread of repeated runs, and RESULTS.md.

A figure measured more than once (``--repeat``) keeps every sample: the table and the ``name=value`` lines give
the median, with ``name_min`` / ``name_max`` beside it. RESULTS.md has one generated block per section: the
``e2e`` measure's own, and one for everything else; a run rewrites only the blocks it measured something for.
"""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from .common import HERE, Lateness, fmt, median

TARGETS = {
    "drain_ratio": (">=", 0.8),
    "publish_ratio_rabbitmq": (">=", 0.9),
    "publish_ratio_sqs": (">=", 0.9),
    "park_ratio": ("<=", 1.1),
    "lateness_p50_ms": ("<=", 2.0),
    "lateness_p99_ms": ("<=", 5.0),
    "worker_rss_growth_mb": ("<=", 5.0),
    "celery_worker_rss_growth_mb": ("<=", 5.0),
    "bytes_per_parked": ("<=", 150.0),
    "scale_ratio": (">=", 0.85),
    "idle_calls_per_s": ("<=", 1.0),
    "redis_bytes_per_far_message": ("<=", 20.0),
    "tier_lateness_p99_ms": ("<=", 5.0),
    "celery_e2e_redis_cpu_ratio": ("<=", 1.0),
    "celery_e2e_drain_ratio": ("<=", 1.0),
    "celery_park_ratio": ("<=", 1.0),
    "park_ratio_concurrent": ("<=", 0.8),
    "import_rss_mb": ("<=", 5.0),
}

MAIN = "main"
E2E = "e2e"
"""The sections of RESULTS.md: the e2e measure's block, and the block of every other measure."""


def _median_of(samples: list[Any]) -> Any:
    numbers = [value for value in samples if isinstance(value, int | float)]
    if len(numbers) != len(samples) or not numbers:
        return samples[-1] if samples else ""
    return median([float(value) for value in numbers])


@dataclass
class Row:
    measure: str
    name: str
    section: str
    ours: list[Any] = field(default_factory=list)
    reference: list[Any] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    extra: str = ""

    def cells(self) -> list[str]:
        value = median(self.values)
        text = f"{self.name}={fmt(value)}{self.extra}"
        if len(self.values) > 1:
            text += f" ({fmt(min(self.values))} - {fmt(max(self.values))}, {len(self.values)} runs)"
        verdict = ""
        target = TARGETS.get(self.name)
        if target is not None:
            op, limit = target
            ok = value >= limit if op == ">=" else value <= limit
            verdict = f"{op} {limit:g} {'ok' if ok else 'MISS'}"
        return [self.measure, fmt(_median_of(self.ours)), fmt(_median_of(self.reference)), text, verdict]


class Values(dict[str, float]):
    """``report.values``: the latest value of each name; every value set is kept as a sample, with its section."""

    def __init__(self, report: Report) -> None:
        super().__init__()
        self.report = report
        self.samples: dict[str, list[float]] = {}
        self.sections: dict[str, str] = {}

    def __setitem__(self, name: str, value: float) -> None:
        super().__setitem__(name, value)
        self.samples.setdefault(name, []).append(value)
        self.sections.setdefault(name, self.report.section)


class Report:
    def __init__(self) -> None:
        self.section = MAIN
        self.rows: dict[str, Row] = {}
        self.values = Values(self)
        self.lateness: list[Lateness] = []
        self.rates: dict[str, float] = {}
        self.notes: list[tuple[str, str]] = []
        self.details: list[str] = []

    def add(self, measure: str, ours: Any, reference: Any, name: str, value: float, extra: str = "") -> None:
        self.values[name] = value
        row = self.rows.setdefault(name, Row(measure, name, self.section))
        row.ours.append(ours)
        row.reference.append(reference)
        row.values.append(value)
        row.extra = extra

    def note(self, text: str) -> None:
        if (self.section, text) not in self.notes:  # a repeated run says the same once
            self.notes.append((self.section, text))

    def sections(self) -> list[str]:
        return [name for name in (MAIN, E2E) if name in self.values.sections.values()]

    def table(self, section: str | None = None) -> str:
        headers = ["measure", "ours", "reference", "value", "target"]
        rows = [headers] + [row.cells() for row in self.rows.values() if section in (None, row.section)]
        widths = [max(len(cells[n]) for cells in rows) for n in range(len(headers))]
        lines = []
        for n, cells in enumerate(rows):
            lines.append("| " + " | ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)) + " |")
            if n == 0:
                lines.append("|" + "|".join("-" * (width + 2) for width in widths) + "|")
        return "\n".join(lines)

    def name_values(self, section: str | None = None) -> str:
        lines = []
        for name, samples in self.values.samples.items():
            if section not in (None, self.values.sections[name]):
                continue
            lines.append(f"{name}={median(samples):.3f}")
            if len(samples) > 1:
                lines.append(f"{name}_min={min(samples):.3f}")
                lines.append(f"{name}_max={max(samples):.3f}")
        return "\n".join(lines)

    def notes_of(self, section: str | None = None) -> list[str]:
        return [text for where, text in self.notes if section in (None, where)]


# -- RESULTS.md ----------------------------------------------------------------------------------------------------

MARKERS = {
    MAIN: ("<!-- generated:start -->", "<!-- generated:end -->"),
    E2E: ("<!-- generated:e2e:start -->", "<!-- generated:e2e:end -->"),
}
E2E_HEADING = "## End to end with real workers (`--only e2e`)"


def versions(redis_server: str | None = None) -> dict[str, str]:
    def command(*args: str) -> str:
        try:
            return subprocess.run(args, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return "n/a"

    found = {
        "python": platform.python_version(),
        "redis-server": command(redis_server or "redis-server", "--version").split(" v=")[-1].split(" ")[0],
        "rabbitmq-server": command("dpkg-query", "-W", "-f=${Version}", "rabbitmq-server") or "n/a",
        "erlang": command("dpkg-query", "-W", "-f=${Version}", "erlang-base") or "n/a",
    }
    for package in ("dramatiq", "dramatiq-sqs", "celery", "kombu", "redis", "moto", "celery-longterm-scheduler"):
        try:
            found[package if package != "redis" else "redis-py"] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "not installed"
    return found


def load_average() -> str:
    return ", ".join(f"{value:.2f}" for value in os.getloadavg())


def machine(load_at_start: str | None = None) -> str:
    memory = "n/a"
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                memory = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    cpu = "n/a"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    start = f"at the start {load_at_start}, " if load_at_start else ""
    return f"{os.cpu_count()} CPUs (nproc), {cpu}, {memory} RAM, load average {start}at the end {load_average()}"


@dataclass
class RunInfo:
    command: str
    scale: str
    elapsed: float
    repeat: int = 1
    load_at_start: str | None = None
    redis_server: str | None = None


def _block(report: Report, section: str, run: RunInfo, chart: Path | None) -> list[str]:
    start, end = MARKERS[section]
    notes = report.notes_of(section)
    spread = f", each measure run {run.repeat} times (median, and min - max)" if run.repeat > 1 else ""
    return [
        start,
        f"Generated by `{run.command}` (scale `{run.scale}`{spread}) on {time.strftime('%Y-%m-%d %H:%M %Z')}, "
        f"in {run.elapsed / 60:.1f} min.",
        "",
        f"- Machine: {machine(run.load_at_start)}",
        "- Versions: " + ", ".join(f"{name} {version}" for name, version in versions(run.redis_server).items()),
        "",
        report.table(section),
        "",
        *([f"Notes: {'; '.join(notes)}", ""] if notes else []),
        "```",
        report.name_values(section),
        "```",
        "",
        *([f"![lateness distribution and drain rates]({chart.name})", ""] if chart else []),
        end,
    ]


def write_results(report: Report, run: RunInfo, chart: Path | None, path: Path = HERE / "RESULTS.md") -> Path:
    """Rewrites the generated block of each section this run measured; the rest of the file is kept."""
    start, end = MARKERS[MAIN]
    text = (
        path.read_text() if path.exists() else f"# Benchmark results\n\n{start}\n{end}\n\n## Commentary\n\n(none yet)\n"
    )
    for section in report.sections():
        start, end = MARKERS[section]
        if start not in text:  # the e2e block, the first time: after the main block, under its own heading
            main_end = MARKERS[MAIN][1]
            head, tail = text.split(main_end, 1)
            text = f"{head}{main_end}\n\n{E2E_HEADING}\n\n{start}\n{end}{tail}"
        head, rest = text.split(start, 1)
        tail = rest.split(end, 1)[1]
        text = head + "\n".join(_block(report, section, run, chart if section == MAIN else None)) + tail
    path.write_text(text)
    return path
