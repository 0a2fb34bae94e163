"""``cancel`` and ``reschedule``: change parked messages."""

from __future__ import annotations

import click
from rich.text import Text

from ..clock import delay_to_ms, ms_to_datetime
from ..store import MessageInfo
from .common import (
    STATE_WORDS,
    confirm,
    confirm_option,
    emit_json,
    get_message,
    open_session,
    reports_errors,
    store_options,
)
from .format import (
    format_relative,
    format_time,
    iso_time,
    parse_duration,
    parse_iso,
    printable,
)

# -- cancel / reschedule -----------------------------------------------------------------------------------------


def describe(info: MessageInfo) -> str:
    envelope = info.envelope
    what = f"{envelope.framework} {envelope.name or envelope.route}" if envelope else "corrupt envelope"
    when = f", due {format_time(info.due_ms)}" if info.state == "due" else ""
    return f"{printable(info.id)!r} ({printable(what)}{when}, {STATE_WORDS[info.state]})"


@click.command(short_help="Delete a parked message for good (asks first).")
@click.argument("id")
@confirm_option
@store_options
@reports_errors
def cancel(id: str, yes: bool, redis_url: str | None, namespace: str, as_json: bool) -> None:
    """Delete parked message ID so that it never runs. Also deletes a dead-lettered one. A message in flight
    (being promoted right now) cannot be cancelled.

    Asks for confirmation; when not at a terminal, refuses unless --yes is given.
    """
    session = open_session(redis_url, namespace, as_json)
    info = get_message(session, id)
    if info.state == "inflight":
        raise click.ClickException(f"message {describe(info)} is being promoted right now; it cannot be cancelled")
    confirm(f"cancel message {describe(info)}", f"Cancel message {describe(info)}? It is deleted for good.", yes)
    if not session.store.cancel(id):
        raise click.ClickException(f"message {printable(id)!r} could not be cancelled: it was promoted meanwhile")
    if as_json:
        emit_json({"id": id, "cancelled": True, "state": info.state})
    else:
        session.console.print(Text(f"Cancelled {describe(info)}."))


@click.command(short_help="Move a parked message: --in 5m, --at ISO-TIME or --now.")
@click.argument("id")
@click.option("--in", "in_", metavar="DURATION", help="Due this long from now: 90s, 5m, 2h, 3d, 1w, 1h30m.")
@click.option("--at", "at", metavar="TIME", help="Due at this ISO 8601 time (UTC unless it has an offset).")
@click.option("--now", "now", is_flag=True, help="Due now: promoted at once.")
@store_options
@reports_errors
def reschedule(
    id: str,
    in_: str | None,
    at: str | None,
    now: bool,
    redis_url: str | None,
    namespace: str,
    as_json: bool,
) -> None:
    """Give parked message ID a new due time: exactly one of --in, --at and --now. Only parked messages can
    be moved (for dead-lettered ones use: delay-broker dead requeue ID).

    \b
    Examples:
      delay-broker reschedule 6f1c... --in 10m
      delay-broker reschedule 6f1c... --at 2030-01-31T09:00:00+01:00
      delay-broker reschedule 6f1c... --now
    """
    if sum(option is not None and option is not False for option in (in_, at, now)) != 1:
        raise click.UsageError("give exactly one of --in DURATION, --at TIME and --now")
    session = open_session(redis_url, namespace, as_json)
    try:
        if at is not None:
            due = parse_iso(at)
        else:
            # The Redis clock, like every relative delay.
            due = ms_to_datetime(session.store.now_ms() + delay_to_ms(0 if now else parse_duration(in_ or "")))
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--in/--at") from None
    info = get_message(session, id)
    if info.state != "due":
        hint = " (use: delay-broker dead requeue ID)" if info.state == "dead" else ""
        raise click.ClickException(f"message {describe(info)} is not parked, so it cannot be rescheduled{hint}")
    if info.envelope is not None and info.envelope.framework == "celery":
        # A Celery message carries its own eta, which must move with it (see delay_broker.celery.reschedule).
        try:
            from ..celery.messages import reschedule_parked
        except ImportError:
            raise click.ClickException(
                "moving a Celery task rewrites its eta header, which needs celery installed"
            ) from None
        due_ms = reschedule_parked(session.store, id, due)
    else:
        due_ms = session.store.reschedule(id, due=due)
    if due_ms is None:
        raise click.ClickException(f"message {printable(id)!r} could not be rescheduled: it was promoted meanwhile")
    if as_json:
        emit_json({"id": id, "due_ms": due_ms, "due": iso_time(due_ms)})
    else:
        store_now = session.store.now_ms()
        session.console.print(
            Text(f"Rescheduled {printable(id)!r}: due {format_time(due_ms)} ({format_relative(due_ms, store_now)}).")
        )


COMMANDS = [cancel, reschedule]
"""This module's commands, in the order ``delay-broker --help`` lists them."""
