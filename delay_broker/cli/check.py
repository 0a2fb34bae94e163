"""``delay-broker check``: what is wrong with the store's packs (read-only), and ``--repair``: mend what is safe."""

from __future__ import annotations

import sys
from collections import Counter

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..store.checking import CheckReport, RepairReport, ShardCheck, check_store, repair_store
from .common import emit_json, open_session, reports_errors, store_options
from .format import printable

ROWS = 20
"""Rows of a shard's table at most: the JSON output lists every finding."""


@click.command(short_help="Find damage in the store's packs (read-only); --repair mends what is safe.")
@click.option(
    "--repair",
    is_flag=True,
    help="Mend what is safe to mend, while producers and promoters go on, then check again.",
)
@store_options
@reports_errors
def check(repair: bool, redis_url: str | None, namespace: str, as_json: bool) -> None:
    """Look for damage in the packs (the compact layout of messages due far ahead): index entries pointing at
    nothing or in the wrong partition, records without their index entry, stale copies, counts and bases that
    drifted, packs never to be opened or opened late, bookkeeping of packs that are gone. Reads only; each
    finding is confirmed atomically before it is reported. Exit status 0 when nothing is wrong, 1 when damage
    is found (or, with --repair, left).

    With --repair, each finding is mended only if it is still as found (else it is left for the next run:
    "changed meanwhile"), in rounds until nothing is left: a record without its entry is indexed, a stale copy
    cleared, an entry pointing at nothing re-pointed at its record or deleted (counted as lost), counts, bases
    and listings set to what the records show. Keys of the wrong type are left to you.

    \b
    Examples:
      delay-broker check --redis-url redis://localhost:6379/0
      delay-broker check --repair --namespace celery --json
    """
    session = open_session(redis_url, namespace, as_json)
    if repair:
        result = repair_store(session.store)
        if as_json:
            emit_json(result.as_dict())
        else:
            show_repair(session.console, result)
        left = result.left
    else:
        left = check_store(session.store)
        if as_json:
            emit_json(left.as_dict())
        else:
            show_report(session.console, left)
    if left.damaged:
        sys.exit(1)


def show_report(console: Console, report: CheckReport, *, heading: str = "") -> None:
    if heading:
        console.print(Text(heading, style="bold"))
    for shard in report.shards:
        console.print(Text(summary(shard)))
        if shard.findings:
            console.print(table(shard))
    if report.unconfirmed:
        console.print(
            Text(
                f"{report.unconfirmed:,} finding(s) were gone when confirmed (the store changed while it was read): "
                "not reported; run the check again to look once more."
            )
        )
    if not report.damaged:
        console.print(Text("No damage found.", style="green"))


def summary(shard: ShardCheck) -> str:
    found = f"{len(shard.findings):,} finding(s)" if shard.findings else "nothing wrong"
    counted = f"; scripts met damage {shard.damaged_counter:,} time(s) (pack_damaged)" if shard.damaged_counter else ""
    return (
        f"shard {shard.shard} ({printable(shard.pattern)}): {shard.packs:,} pack(s), {shard.records:,} record(s), "
        f"{shard.entries:,} index entries: {found}{counted}"
    )


def table(shard: ShardCheck) -> Table:
    """A shard's findings, one row per kind and key (with the first problem of the kind as the example)."""
    rows: dict[tuple[str, str], list[int]] = {}
    examples: dict[tuple[str, str], tuple[str, str]] = {}
    for finding in shard.findings:
        group = (finding.kind, finding.key)
        counts = rows.setdefault(group, [0, 0, 0])
        counts[0] += 1
        counts[1] += finding.messages
        counts[2] += finding.lost
        examples.setdefault(group, (finding.problem, finding.repair or "none: mend it by hand"))
    grid = Table(show_lines=False)
    for column in ("kind", "key", "found", "messages", "what is wrong (first)", "repair"):
        grid.add_column(column, justify="right" if column in ("found", "messages") else "left", overflow="fold")
    for n, ((kind, key), (found, messages, lost)) in enumerate(rows.items()):
        if n == ROWS:
            grid.add_row("...", f"{len(rows) - ROWS} more (--json lists every finding)", "", "", "", "")
            break
        problem, repair = examples[(kind, key)]
        lost_note = f" ({lost:,} lost)" if lost else ""
        grid.add_row(kind, printable(key), f"{found:,}", f"{messages:,}{lost_note}", printable(problem), repair)
    return grid


def show_repair(console: Console, result: RepairReport) -> None:
    show_report(console, result.found, heading="Found:")
    if not result.rounds:
        return
    console.print(Text(f"Repaired in {result.rounds} round(s): {counted(result.repaired) or 'nothing'}.", style="bold"))
    if result.changed:
        console.print(Text(f"Changed meanwhile, left alone: {counted(result.changed)} (run again)."))
    if result.lost:
        console.print(Text(f"Written off as lost (no record of them anywhere): {result.lost:,} message(s)."))
    show_report(console, result.left, heading="Left:")


def counted(kinds: Counter[str]) -> str:
    return ", ".join(f"{count:,} {kind}" for kind, count in sorted(kinds.items()))


COMMANDS = [check]
"""This module's commands, in the order ``delay-broker --help`` lists them."""
