"""``python -m integration.chaos --scale ci|tenth|full [--seed N] [--json PATH] [--logs DIR] [--without-once]``; exit
status 1 if a target missed its guarantee (lost, early, unexplained duplicates, duplicates beyond the bound)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from .run import SCALES, ChaosRun


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m integration.chaos")
    parser.add_argument("--scale", choices=sorted(SCALES), default="ci")
    parser.add_argument("--seed", type=int, help="seed of the faults' timeline and the delays (default: random)")
    parser.add_argument("--json", type=Path, help="write the full report (ids of every duplicate) here")
    parser.add_argument("--logs", type=Path, help="directory for worker and producer logs (default: a temp dir)")
    parser.add_argument(
        "--without-once",
        action="store_true",
        help="the at-least-once lanes run every delivery (no OnceMiddleware), as before effectively-once existed",
    )
    options = parser.parse_args()
    if options.logs:
        options.logs.mkdir(parents=True, exist_ok=True)
    report = ChaosRun(options.scale, options.seed, options.logs, once=not options.without_once).execute()
    for line in report.lines():
        print(line, flush=True)
    if options.json:
        options.json.write_text(json.dumps(asdict(report), indent=2))
    sys.exit(0 if report.ok else 1)


if __name__ == "__main__":
    main()
