"""``cancel`` and ``reschedule``: change parked messages."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import datetime

import click
from rich.text import Text

from ..clock import delay_to_ms, ms_to_datetime
from ..errors import DelayBrokerError
from ..operations import UNREWRITABLE, Operations, reschedule_one
from ..store import MessageInfo
from .common import (
    STATE_WORDS,
    FilterArgs,
    Session,
    act_on_filter,
    confirm,
    confirm_option,
    emit_json,
    filter_options,
    get_message,
    open_session,
    report,
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


@click.command(short_help="Delete parked messages for good: IDs, or all that match a filter (asks first).")
@click.argument("ids", nargs=-1, metavar="[ID]...")
@filter_options
@confirm_option
@store_options
@reports_errors
def cancel(
    ids: Sequence[str],
    filters: FilterArgs,
    yes: bool,
    redis_url: str | None,
    namespace: str,
    as_json: bool,
) -> None:
    """Delete parked message ID so that it never runs (a dead-lettered one too), or several IDs, or every parked
    message that matches --queue/--task/--id-prefix/--text/--from/--to. A message in flight (being promoted
    right now) cannot be cancelled.

    \b
    Examples:
      delay-broker cancel 6f1c...
      delay-broker cancel --task send_newsletter --yes          every parked send_newsletter
      delay-broker cancel --queue emails --text @example.org --to 1d

    Asks for confirmation, showing how many messages it touches; when not at a terminal, refuses unless --yes
    is given.
    """
    session = open_session(redis_url, namespace, as_json)
    if act_on_filter(session, ids, filters, "due", yes, "cancel", lambda ops, chosen: ops.cancel(chosen)):
        return
    if not ids:
        raise click.UsageError("give the IDs to cancel, or a filter: --queue, --task, --id-prefix, --text, --from/--to")
    if len(ids) > 1:
        unique = list(dict.fromkeys(ids))
        confirm(f"cancel {len(unique)} messages", f"Cancel {len(unique)} messages? They are deleted for good.", yes)
        result = Operations(session.store).cancel(ids=unique)
        report(
            session,
            {"cancelled": result.done, "not_cancelled": result.skipped},
            f"Cancelled {result.done:,} of {result.matched:,} message(s).",
        )
        if result.skipped:
            # As for one ID and for dead requeue: an ID given and not acted on fails the command.
            shown = ", ".join(repr(printable(id)) for id in result.skipped[:20])
            click.echo(f"Not cancelled (unknown, promoted or in flight): {shown}", err=True)
            sys.exit(1)
        return
    id = ids[0]
    info = get_message(session, id)
    if info.state == "inflight":
        raise click.ClickException(f"message {describe(info)} is being promoted right now; it cannot be cancelled")
    confirm(f"cancel message {describe(info)}", f"Cancel message {describe(info)}? It is deleted for good.", yes)
    if not session.store.cancel(id):
        raise click.ClickException(f"message {printable(id)!r} could not be cancelled: it was promoted meanwhile")
    report(session, {"id": id, "cancelled": True, "state": info.state}, f"Cancelled {describe(info)}.")


@click.command(short_help="Move a parked message, or all that match a filter: --in 5m, --at ISO-TIME or --now.")
@click.argument("id", required=False)
@click.option("--in", "in_", metavar="DURATION", help="Due this long from now: 90s, 5m, 2h, 3d, 1w, 1h30m.")
@click.option("--at", "at", metavar="TIME", help="Due at this ISO 8601 time (UTC unless it has an offset).")
@click.option("--now", "now", is_flag=True, help="Due now: promoted at once.")
@filter_options
@confirm_option
@store_options
@reports_errors
def reschedule(
    id: str | None,
    in_: str | None,
    at: str | None,
    now: bool,
    filters: FilterArgs,
    yes: bool,
    redis_url: str | None,
    namespace: str,
    as_json: bool,
) -> None:
    """Give parked message ID a new due time, or every parked message matching a filter (--queue, --task,
    --id-prefix, --text, --from/--to; asks first): exactly one of --in, --at and --now. Only parked messages
    can be moved (for dead-lettered ones use: delay-broker dead requeue ID). A Celery task's own eta moves with it.

    \b
    Examples:
      delay-broker reschedule 6f1c... --in 10m
      delay-broker reschedule 6f1c... --at 2030-01-31T09:00:00+01:00
      delay-broker reschedule 6f1c... --now
      delay-broker reschedule --queue reports --now --yes      run every parked report now
    """
    if sum(option is not None and option is not False for option in (in_, at, now)) != 1:
        raise click.UsageError("give exactly one of --in DURATION, --at TIME and --now")
    session = open_session(redis_url, namespace, as_json)
    due = due_time(session, in_, at, now)
    verb = "run now" if now else "reschedule"
    if act_on_filter(
        session,
        [id] if id else None,
        filters,
        "due",
        yes,
        verb,
        lambda ops, chosen: ops.reschedule(chosen, due=due),
    ):
        return
    if not id:
        raise click.UsageError("give the ID to move, or a filter: --queue, --task, --id-prefix, --text, --from/--to")
    reschedule_message(session, id, due)


def due_time(session: Session, in_: str | None, at: str | None, now: bool) -> datetime:
    """The new due time ``--in``, ``--at`` or ``--now`` gives (relative ones by the Redis clock)."""
    try:
        if at is not None:
            return parse_iso(at)
        # The Redis clock, like every relative delay.
        return ms_to_datetime(session.store.now_ms() + delay_to_ms(0 if now else parse_duration(in_ or "")))
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--in/--at") from None


def reschedule_message(session: Session, id: str, due: datetime) -> None:
    """Move the parked message ``id`` to ``due`` (a Celery task's eta with it) and say where it is now."""
    info = get_message(session, id)
    if info.state != "due":
        hint = " (use: delay-broker dead requeue ID)" if info.state == "dead" else ""
        raise click.ClickException(f"message {describe(info)} is not parked, so it cannot be rescheduled{hint}")
    try:
        due_ms = reschedule_one(session.store, id, due)
    except DelayBrokerError:
        raise  # reports_errors says it in one line
    except UNREWRITABLE as error:
        raise click.ClickException(
            f"message {printable(id)!r} could not be rescheduled, its payload cannot be rewritten: "
            f"{printable(f'{type(error).__name__}: {error}')}"
        ) from None
    if due_ms is None:
        raise click.ClickException(f"message {printable(id)!r} could not be rescheduled: it was promoted meanwhile")
    if session.as_json:
        emit_json({"id": id, "due_ms": due_ms, "due": iso_time(due_ms)})
    else:
        store_now = session.store.now_ms()
        session.console.print(
            Text(f"Rescheduled {printable(id)!r}: due {format_time(due_ms)} ({format_relative(due_ms, store_now)}).")
        )


COMMANDS = [cancel, reschedule]
"""This module's commands, in the order ``delay-broker --help`` lists them."""
