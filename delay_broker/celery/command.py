"""``celery -A app delay-broker ...``: the adapter's commands inside Celery's own CLI.

Registered through the ``celery.commands`` entry point. Celery imports this module on every start of its
CLI, so it imports nothing heavy until a subcommand runs.
"""

from __future__ import annotations

from typing import Any

import click

from ..clock import ms_to_datetime


def _app(ctx: click.Context) -> Any:
    obj = ctx.find_root().obj
    app = getattr(obj, "app", None)
    if app is None:
        raise click.UsageError("no Celery app: run it as `celery -A module:app delay-broker ...`")
    return app


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return ms_to_datetime(ms).isoformat(timespec="milliseconds")


@click.group(name="delay-broker", context_settings={"help_option_names": ["-h", "--help"]})
def delay_broker_command() -> None:
    """Parked long-delay tasks of this app: run a promoter, show stats, cancel or reschedule by task id."""


@delay_broker_command.command()
@click.option("--batch", type=click.IntRange(1, 1000), default=None, help="Messages per claim (1-1000).")
@click.option("--lease", type=click.FloatRange(min=1), default=None, help="Seconds a claimed message is held.")
@click.option("--max-idle", type=click.FloatRange(min=0.1), default=None, help="Longest sleep in seconds.")
@click.pass_context
def promote(ctx: click.Context, batch: int | None, lease: float | None, max_idle: float | None) -> None:
    """Run a promoter in this process until interrupted (SIGINT/SIGTERM stop it after its batch)."""
    from ..running import run_until_signalled
    from .api import build_promoter

    overrides: dict[str, Any] = {
        k: v for k, v in (("batch", batch), ("lease", lease), ("max_idle", max_idle)) if v is not None
    }
    run_until_signalled(build_promoter(_app(ctx), **overrides))


@delay_broker_command.command()
@click.pass_context
def stats(ctx: click.Context) -> None:
    """Counts of parked, in-flight and dead-lettered tasks, next due time and live promoters."""
    from .api import store_for

    store = store_for(_app(ctx))
    s = store.stats()
    rows = [
        ("namespace", store.keys.namespace),
        ("parked", s.parked),
        ("in flight", s.inflight),
        ("dead-lettered", s.dead),
        ("overdue", s.overdue),
        ("oldest overdue (ms)", s.oldest_overdue_age_ms),
        ("next due", _when(s.next_due_ms)),
        ("live promoters", s.live_promoters),
        *((f"total {name}", value) for name, value in sorted(s.counters.items())),
    ]
    for name, value in rows:
        click.echo(f"{name:<22}{value}")


@delay_broker_command.command()
@click.argument("task_ids", nargs=-1, required=True)
@click.pass_context
def cancel(ctx: click.Context, task_ids: tuple[str, ...]) -> None:
    """Cancel parked tasks by id (exit status 1 if any was not parked)."""
    from .api import store_for

    store = store_for(_app(ctx))
    missing = 0
    for task_id in task_ids:
        if store.cancel(task_id):
            click.echo(f"cancelled {task_id}")
        else:
            missing += 1
            click.echo(f"not parked: {task_id}", err=True)
    ctx.exit(1 if missing else 0)


@delay_broker_command.command()
@click.argument("task_id")
@click.option("--countdown", type=click.FloatRange(min=0), required=True, help="Seconds from now (0: due now).")
@click.pass_context
def reschedule(ctx: click.Context, task_id: str, countdown: float) -> None:
    """Move a parked task to a new due time."""
    from .api import reschedule as move

    due = move(_app(ctx), task_id, countdown=countdown)
    if due is None:
        click.echo(f"not parked: {task_id}", err=True)
        ctx.exit(1)
    click.echo(f"{task_id} due at {due.isoformat()}")


@delay_broker_command.command()
@click.argument("task_id")
@click.pass_context
def show(ctx: click.Context, task_id: str) -> None:
    """What the store holds for a task id."""
    from .api import get

    info = get(_app(ctx), task_id)
    if info is None:
        click.echo(f"unknown: {task_id}", err=True)
        ctx.exit(1)
    assert info is not None
    envelope = info.envelope
    click.echo(f"state     {info.state}")
    click.echo(f"due       {_when(info.due_ms)}")
    click.echo(f"task      {envelope.name if envelope else '-'}")
    click.echo(f"route     {envelope.route if envelope else '-'!r}")
    click.echo(f"attempts  {info.attempts}")
    if info.error:
        click.echo(f"error     {info.error}")
