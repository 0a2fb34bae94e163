"""``delay-broker reshard``: change a namespace's shard count while producers and promoters run (a dry run unless
``--yes``)."""

from __future__ import annotations

import time

import click
from rich.table import Table
from rich.text import Text

from ..keys import MAX_SHARDS
from ..store import ReshardReport
from ..store.resharding import SETTLE_SECONDS
from .common import Session, emit_json, open_session, reports_errors, store_options
from .format import printable

PROGRESS_EVERY = 2.0
"""Seconds between two lines about the messages moved so far (steps and passes are said as they come)."""


@click.command(short_help="Change the namespace's shard count online (dry run first; --yes to do it).")
@click.option(
    "--to", "to", required=True, type=click.IntRange(1, MAX_SHARDS), metavar="N", help="The new number of shards."
)
@click.option("--yes", "-y", is_flag=True, help="Do it. Without it: where the namespace stands, nothing changed.")
@click.option(
    "--batch",
    type=click.IntRange(1, 500),
    default=500,
    show_default=True,
    help="Messages taken out of a shard at once.",
)
@click.option(
    "--settle",
    type=click.FloatRange(min=0),
    default=SETTLE_SECONDS,
    show_default=True,
    metavar="SECONDS",
    help="Wait between announcing the reshard and parking by the new layout: every process of the application "
    "must have read the layout by then (each reads it again within a second as it is used).",
)
@store_options
@reports_errors
def reshard(
    to: int, yes: bool, batch: int, settle: float, redis_url: str | None, namespace: str, as_json: bool
) -> None:
    """Move the namespace to N shards while producers park and promoters promote: announce it, wait for every
    process to see it, switch new parks to the new layout, move each message whose home shard changes (in
    batches), finish. Every process must run a release of delay_broker that knows reshards.

    Without --yes it shows the layout, each shard's messages and about how many would move, and changes
    nothing. With --yes it does it; killed at any point, run it again: it goes on where it stopped, and
    nothing is lost or promoted twice. Promoters must be running: messages in flight are moved once they are
    acknowledged or their lease ends.

    \b
    Examples:
      delay-broker reshard --to 12
      delay-broker reshard --to 12 --yes
    """
    session = open_session(redis_url, namespace, as_json)
    if not yes:
        report = session.store.reshard(to, dry_run=True)
        if as_json:
            emit_json(report.as_dict())
        else:
            show_status(session, report)
        return
    said = Said(session)
    report = session.store.reshard(to, batch=batch, settle=settle, progress=said)
    if as_json:
        emit_json(report.as_dict())
    else:
        show_done(session, report)


class Said:
    """What a run says as it goes: each step, each pass, and the messages moved every few seconds (on stderr with
    --json, so that stdout holds the JSON alone)."""

    def __init__(self, session: Session) -> None:
        self.err = session.as_json
        self.last_step = ""
        self.last_at = 0.0

    def __call__(self, step: str, moved: int) -> None:
        now = time.monotonic()
        if step.startswith("shard ") or step.startswith("waiting "):
            if now - self.last_at < PROGRESS_EVERY:
                return
            step = f"{step}: {moved:,} moved so far" if step.startswith("shard ") else step
        elif step == self.last_step:
            return
        self.last_step, self.last_at = step, now
        click.echo(printable(step), err=self.err)


def show_status(session: Session, report: ReshardReport) -> None:
    console = session.console
    console.print(Text(f"Namespace {printable(report.namespace)!r}: {report.before.describe()}."))
    table = Table(show_edge=False, pad_edge=False)
    for column in ("shard", "tag", "layout", "parked", "packed", "in flight", "dead", "in transit"):
        table.add_column(column, justify="left" if column in ("tag", "layout") else "right")
    for shard in report.shards:
        table.add_row(
            str(shard.shard),
            Text(printable(shard.tag)),
            shard.role,
            f"{shard.parked:,}",
            f"{shard.packed:,}",
            f"{shard.inflight:,}",
            f"{shard.dead:,}",
            f"{shard.in_transit:,}",
        )
    console.print(table)
    if report.before.state == "stable" and report.before.shards == report.to:
        console.print(Text(f"It has {report.to} shard(s) already: nothing to do."))
        return
    what = "finishes the reshard under way" if report.before.state != "stable" else f"moves it to {report.to} shard(s)"
    console.print(
        Text(f"Dry run: --yes {what}, moving about {report.estimate:,} message(s) to another shard. Nothing changed.")
    )


def show_done(session: Session, report: ReshardReport) -> None:
    if report.moved == 0 and report.passes == 0:
        name = printable(report.namespace)
        session.console.print(Text(f"Namespace {name!r} has {report.to} shard(s): nothing to do."))
        return
    session.console.print(
        Text(
            f"Namespace {printable(report.namespace)!r}: {report.after.describe()}. Moved {report.moved:,} message(s) "
            f"in {report.seconds:.1f} s ({report.rate:,.0f}/s, {report.passes} pass(es))."
        )
    )


COMMANDS = [reshard]
