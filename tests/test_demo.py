"""The demo command runs end to end on a private redis-server it starts itself."""

from __future__ import annotations

import subprocess
import sys


def run_demo(*args: str) -> dict[str, list[str]]:
    result = subprocess.run(
        [sys.executable, "-c", "from delay_broker.cli import main; main()", "demo", *args],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "private redis-server" in " ".join(result.stdout.split())
    rows = {}
    for line in result.stdout.splitlines():
        cells = [cell.strip() for cell in line.strip("│ ").split("│")]
        if len(cells) >= 2:
            rows[cells[0]] = cells[1:]
    return rows


def test_dramatiq_demo_runs_every_message_once_with_and_without_delay_broker():
    rows = run_demo("--messages", "300", "--seconds", "1", "--max-delay", "3")
    assert rows["executed"] == ["300", "300"]
    assert rows["duplicates"][0] == "0" and rows["lost"][0] == "0"
    assert rows["worker memory growth"][0].endswith("MB")


def test_lists_demo_parks_promotes_and_counts_no_duplicates_or_losses():
    rows = run_demo("--lists", "--messages", "500", "--seconds", "2")
    assert rows["parked"] == ["500"] and rows["received by the worker"] == ["500"]
    assert rows["duplicates"] == ["0"] and rows["lost"] == ["0"]
