"""Charts as inline SVG made on the server: the page needs no script and no asset from anywhere else."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape


def bar_chart(bars: Sequence[tuple[str, int]], *, width: int = 560, height: int = 180, danger: str = "") -> str:
    """Vertical bars with their label and count; the bar labelled ``danger`` is drawn in red."""
    if not bars:
        return ""
    largest = max((count for _, count in bars), default=0) or 1
    slot = width / len(bars)
    bar_width = slot * 0.62
    plot = height - 42
    parts = [
        f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        'aria-label="bar chart">'
    ]
    for n, (label, count) in enumerate(bars):
        x = n * slot + (slot - bar_width) / 2
        bar_height = 0 if count == 0 else max(2.0, plot * count / largest)
        y = 18 + plot - bar_height
        css = "bar danger" if label == danger else "bar"
        parts.append(
            f'<rect class="{css}" x="{x:.1f}" y="{y:.1f}" width="{bar_width:.1f}" height="{bar_height:.1f}">'
            f"<title>{escape(label)}: {count:,}</title></rect>"
            f'<text class="count" x="{x + bar_width / 2:.1f}" y="{y - 4:.1f}">{count:,}</text>'
            f'<text class="label" x="{x + bar_width / 2:.1f}" y="{height - 8}">{escape(label)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)
