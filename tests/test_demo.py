"""The demo command runs end to end on a private redis-server it starts itself."""

from __future__ import annotations

import subprocess
import sys


def test_demo_parks_promotes_and_counts_no_duplicates_or_losses():
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from delay_broker.cli import main; main()",
            "demo",
            "--messages",
            "500",
            "--seconds",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = {line.strip("│ ").split("│")[0].strip(): line for line in result.stdout.splitlines() if "│" in line}
    assert "500" in lines["parked"] and "500" in lines["received by the worker"]
    assert lines["duplicates"].split("│")[-2].strip() == "0"
    assert lines["lost"].split("│")[-2].strip() == "0"
    assert "private redis-server" in result.stdout
