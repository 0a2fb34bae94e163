"""The chart referenced from RESULTS.md: lateness distributions (CDF) and drain/publish rates."""

from __future__ import annotations

from pathlib import Path

from .common import Lateness


def draw(lateness: list[Lateness], rates: dict[str, float], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(15, 6))
    for series in lateness:
        if not series.samples:
            continue
        ordered = sorted(series.samples)
        share = [(n + 1) / len(ordered) for n in range(len(ordered))]
        left.plot(ordered, share, label=f"{series.label} (p50 {series.p50:.1f}, p99 {series.p99:.1f} ms)")
    left.set_xscale("symlog", linthresh=1.0)
    left.set_xlabel("lateness: due time to start (ms, symlog)")
    left.set_ylabel("share of messages")
    left.set_title("Lateness, 1,000 messages/s coming due")
    left.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=7, loc="lower right")

    names = list(rates)
    right.barh(names, [rates[name] for name in names], color="tab:blue")
    right.set_xscale("log")
    right.set_xlabel("messages per second (log)")
    right.set_title("Drain and publish rates (same run)")
    right.invert_yaxis()
    for n, name in enumerate(names):
        right.text(rates[name], n, f" {rates[name]:,.0f}", va="center", fontsize=7)
    right.grid(True, axis="x", which="both", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
