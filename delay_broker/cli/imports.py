"""``delay-broker import``: move delayed messages that wait in broker queues into the delay store (a dry run unless
``--yes``)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from ..clock import delay_to_ms, iso_time
from ..importing import Importer, QueueReport, Source
from ..store import DelayStore
from .common import emit_json, make_console, reports_errors
from .format import format_time, printable
from .serve import app_object


@click.command("import", short_help="Move delayed messages waiting in broker queues into the store (dry run first).")
@click.option("--dramatiq", "dramatiq_broker", metavar="MODULE:BROKER", help="Import the delay queues of this broker.")
@click.option("--celery", "celery_app", metavar="MODULE:APP", help="Import the ETA tasks of this app's queues.")
@click.option(
    "--queue",
    "queues",
    multiple=True,
    metavar="QUEUE",
    help="Only this queue (repeat for more). Default: every queue the app declares.",
)
@click.option(
    "--threshold",
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="Move the messages due more than this from now; the others stay. Default: the app's threshold.",
)
@click.option("--batch", type=click.IntRange(1, 1000), default=500, show_default=True, help="Messages moved at once.")
@click.option("--yes", "-y", is_flag=True, help="Move them. Without it: a dry run that changes nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (for scripts) instead of a table.")
@reports_errors
def import_messages(
    dramatiq_broker: str | None,
    celery_app: str | None,
    queues: Sequence[str],
    threshold: float | None,
    batch: int,
    yes: bool,
    as_json: bool,
) -> None:
    """Move the messages delayed before delay_broker was turned on (or by producers without it) from the
    broker into the delay store: Dramatiq's delay queues (<queue>.DQ) on RedisBroker and RabbitMQ, Celery's ETA
    and countdown tasks in Redis and RabbitMQ queues. Each is parked under its own id, due when it was due; the
    messages due within the threshold, and everything else in the queues, stay where they are.

    Without --yes it is a dry run: it reports per queue how many would move and when they are due, and changes
    nothing (on RabbitMQ it reads the messages and returns them, which marks them redelivered). With --yes it moves
    them, each step safe to interrupt: killed at any point, run it again and nothing is lost or moved twice.

    \b
    Examples:
      delay-broker import --dramatiq myapp.tasks:broker
      delay-broker import --celery myapp.celery:app --queue emails --yes
    """
    if (dramatiq_broker is None) == (celery_app is None):
        raise click.UsageError("give exactly one of --dramatiq MODULE:BROKER and --celery MODULE:APP")
    with opened(dramatiq_broker, celery_app, list(queues), threshold, batch, dry_run=not yes) as (importer, sources):
        reports = [importer.run(source) for source in sources]
    if as_json:
        emit_json(
            {
                "dry_run": not yes,
                "threshold_seconds": importer.threshold_ms / 1000,
                "queues": [_json(report) for report in reports],
            }
        )
    else:
        show(reports, importer.threshold_ms, dry_run=not yes)
    if any(report.refused for report in reports):
        sys.exit(1)


@contextlib.contextmanager
def opened(
    dramatiq_broker: str | None,
    celery_app: str | None,
    queues: list[str],
    threshold: float | None,
    batch: int,
    *,
    dry_run: bool,
) -> Iterator[tuple[Importer, list[Source]]]:
    """The importer for the application's store and threshold, and its queues."""
    if dramatiq_broker is not None:
        import dramatiq

        from ..dramatiq.importing import middleware_of
        from ..dramatiq.importing import open_sources as dramatiq_sources

        broker = app_object("--dramatiq", dramatiq_broker)
        if not isinstance(broker, dramatiq.Broker):
            raise click.UsageError(f"--dramatiq {dramatiq_broker} is a {type(broker).__name__}, not a Dramatiq broker")
        middleware = middleware_of(broker)
        default_ms = delay_to_ms(middleware.threshold)
        importer = _importer(middleware.store, threshold, default_ms, dry_run, record_routes=False)
        with dramatiq_sources(broker, queues, batch=batch) as sources:
            yield importer, sources
        return
    import celery

    from ..celery import app_options, store_for, transport_kind
    from ..celery.importing import open_sources as celery_sources

    app = app_object("--celery", celery_app or "")
    if not isinstance(app, celery.Celery):
        raise click.UsageError(f"--celery {celery_app} is a {type(app).__name__}, not a Celery app")
    default_ms = delay_to_ms(app_options(app).threshold_for(transport_kind(app)[0]))
    importer = _importer(store_for(app), threshold, default_ms, dry_run, record_routes=True)
    with celery_sources(app, queues, batch=batch) as sources:
        yield importer, sources


def _importer(
    store: DelayStore, threshold: float | None, default_ms: int, dry_run: bool, *, record_routes: bool
) -> Importer:
    threshold_ms = default_ms if threshold is None else delay_to_ms(threshold)
    return Importer(store, threshold_ms, dry_run=dry_run, record_routes=record_routes)


def _json(report: QueueReport) -> dict[str, Any]:
    data = report.as_dict()
    data["first_due"] = iso_time(report.first_due_ms)
    data["last_due"] = iso_time(report.last_due_ms)
    return data


def show(reports: list[QueueReport], threshold_ms: int, *, dry_run: bool) -> None:
    console = make_console()
    moved = "would move" if dry_run else "moved"
    table = Table(show_edge=False, pad_edge=False)
    for column in ("queue", "examined", moved, "parked already", "left in the queue", "due from", "due until"):
        table.add_column(column, justify="left" if column in ("queue", "left in the queue") else "right")
    for report in reports:
        left = ", ".join(f"{count:,} {reason}" for reason, count in sorted(report.left.items())) or "-"
        table.add_row(
            Text(printable(report.queue)),
            f"{report.examined:,}",
            f"{report.moved:,}",
            f"{report.already:,}",
            Text(printable(left)),
            format_time(report.first_due_ms) if report.first_due_ms is not None else "-",
            format_time(report.last_due_ms) if report.last_due_ms is not None else "-",
        )
    console.print(table)
    for report in reports:
        for note in report.notes:
            console.print(Text(f"{printable(report.queue)}: {printable(note)}"))
        for id, reason in list(report.refused.items())[:20]:
            console.print(Text(f"{printable(report.queue)}: refused by the store, left in the queue: {id!r}: {reason}"))
    total = sum(report.moved for report in reports)
    threshold = f"due more than {threshold_ms / 1000:g} s from now"
    if dry_run:
        console.print(Text(f"Dry run: {total:,} message(s) {threshold} would move. Nothing changed; --yes moves them."))
    else:
        already = sum(report.already for report in reports)
        console.print(Text(f"Moved {total:,} message(s) {threshold} into the store ({already:,} were parked already)."))


COMMANDS = [import_messages]
