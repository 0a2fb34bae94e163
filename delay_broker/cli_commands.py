"""The commands of ``delay-broker`` (click + rich). Run ``delay-broker --help`` for the overview."""

from __future__ import annotations

import functools
import json
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

import click
import redis
from rich.console import Console, Group
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from .cli_format import (
    bar,
    escape_bytes,
    format_relative,
    format_span,
    format_time,
    histogram_rows,
    iso_time,
    message_record,
    parse_duration,
    parse_iso,
    parse_when,
    printable,
    stats_record,
)
from .clock import delay_to_ms, ms_to_datetime
from .connect import describe as describe_client
from .errors import DelayBrokerError
from .keys import DEFAULT_NAMESPACE
from .store import DelayStore, MessageInfo

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

F = TypeVar("F", bound=Callable[..., Any])
ListState = Literal["due", "inflight", "dead"]

STATE_WORDS = {"due": "parked", "inflight": "in flight", "dead": "dead-lettered", "gone": "gone"}
TIME_COLUMN = {"due": "due", "inflight": "lease until", "dead": "dead since"}
MAX_PAGE = 1000


# -- plumbing ----------------------------------------------------------------------------------------------------


class OrderedGroup(click.Group):
    """Lists commands in the order they are defined (most used first), not alphabetically."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)


def store_options(func: F) -> F:
    """``--redis-url``, ``--namespace`` and ``--json``, shared by every command that reads the store."""
    func = click.option("--json", "as_json", is_flag=True, help="Print JSON (for scripts) instead of tables.")(func)
    func = click.option(
        "--namespace",
        "-n",
        envvar="DELAY_BROKER_NAMESPACE",
        show_envvar=True,
        default=DEFAULT_NAMESPACE,
        show_default=True,
        help="Store namespace your application's delay_broker settings use (Dramatiq's default: default; "
        "Celery's: celery).",
    )(func)
    func = click.option(
        "--redis-url",
        "-r",
        envvar="DELAY_BROKER_REDIS_URL",
        show_envvar=True,
        metavar="URL",
        help="Redis holding the delay store, e.g. redis://localhost:6379/0 (rediss:// and unix:// work too).",
    )(func)
    return func


def confirm_option(func: F) -> F:
    return click.option("--yes", "-y", is_flag=True, help="Do it without asking (needed when not at a terminal).")(func)


@dataclass
class Session:
    store: DelayStore
    namespace: str
    as_json: bool

    @functools.cached_property
    def console(self) -> Console:
        return make_console()


def make_console() -> Console:
    """Rich output on stdout; a wide page when it is not a terminal, so ids are not cut."""
    terminal = sys.stdout.isatty()
    return Console(highlight=False, width=None if terminal else 160)


def open_session(redis_url: str | None, namespace: str, as_json: bool) -> Session:
    if not redis_url:
        raise click.UsageError(
            "no Redis given: pass --redis-url redis://HOST:6379/0 or set DELAY_BROKER_REDIS_URL "
            "(the Redis your application's delay_broker settings point at)"
        )
    try:
        store = DelayStore.from_url(redis_url, namespace=namespace, socket_connect_timeout=5.0, socket_timeout=15.0)
    except ValueError as error:
        raise click.UsageError(f"cannot use --redis-url / --namespace: {error}") from None
    return Session(store, namespace, as_json)


def reports_errors(func: F) -> F:
    """Turn store and Redis errors into a one-line message and exit status 1 (no traceback)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (DelayBrokerError, redis.RedisError) as error:
            raise click.ClickException(str(error) or type(error).__name__) from None

    return cast(F, wrapper)


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, ensure_ascii=True, default=str))


def report(session: Session, data: dict[str, Any], text: str) -> None:
    """What a command did: ``data`` as JSON with ``--json``, else ``text`` (untrusted parts already printable)."""
    if session.as_json:
        emit_json(data)
    else:
        session.console.print(Text(text))


def interactive() -> bool:
    """Whether a person can answer a question (stdin is a terminal)."""
    return sys.stdin.isatty()


def confirm(action: str, question: str, yes: bool) -> None:
    """Ask before a destructive ``action``; without a terminal, refuse unless ``--yes`` was given."""
    if yes:
        return
    if not interactive():
        raise click.ClickException(
            f"refusing to {action} without confirmation: stdin is not a terminal, so add --yes to do it"
        )
    if not click.confirm(question, default=False, err=True):
        raise click.ClickException("aborted: nothing was changed")


def cell(value: object) -> Text:
    """A table cell from untrusted data: no rich markup, no control characters."""
    return Text(printable("-" if value is None else str(value)))


def get_message(session: Session, id: str) -> MessageInfo:
    info = session.store.get(id)
    if info is None:
        raise click.ClickException(
            f"no message {printable(id)!r} in namespace {session.namespace!r} (unknown, or already promoted, "
            "cancelled or purged)"
        )
    return info


# -- the group ---------------------------------------------------------------------------------------------------


@click.group(cls=OrderedGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="delay-broker", prog_name="delay-broker")
def cli() -> None:
    """Inspect and operate the delayed Dramatiq and Celery messages that delay_broker parks in Redis.

    \b
    Common tasks:
      delay-broker stats                     how many are parked, overdue, in flight, dead; promoters alive
      delay-broker ls                        parked messages by due time (ls inflight, ls dead)
      delay-broker show ID                   one message, its payload decoded
      delay-broker reschedule ID --in 10m    move a parked message (or --at ISO-TIME, or --now)
      delay-broker cancel ID                 delete a parked message
      delay-broker dead ls                   dead-lettered messages and why they died
      delay-broker dead requeue ID|--all     send dead-lettered messages again
      delay-broker cron ls                   recurring schedules and their next occurrence
      delay-broker promote --dramatiq myapp.broker:broker --metrics-port 9871
      delay-broker metrics --port 9871       Prometheus endpoint for the backlog

    Commands that read the store take --redis-url (or DELAY_BROKER_REDIS_URL) and --namespace (or
    DELAY_BROKER_NAMESPACE; default "default", which Dramatiq apps use; Celery apps use "celery"), and print
    JSON instead of tables with --json. Times are UTC;
    "due in" and "overdue" are measured by the Redis server's clock. Run "delay-broker COMMAND --help" for
    the options of a command.
    """


# -- stats -----------------------------------------------------------------------------------------------------------


@cli.command(short_help="Counts: parked, overdue, in flight, dead, live promoters; due-time histogram.")
@store_options
@reports_errors
def stats(redis_url: str | None, namespace: str, as_json: bool) -> None:
    """Show what the store holds: parked, in flight, dead and overdue messages, how late the oldest overdue
    one is, when the next is due, how many promoters are alive (heartbeat in the last 30 s), the store's
    counters, and a histogram of parked messages by due time.

    \b
    Examples:
      delay-broker stats --redis-url redis://localhost:6379/0
      DELAY_BROKER_REDIS_URL=redis://redis:6379/0 delay-broker stats --namespace billing --json
    """
    session = open_session(redis_url, namespace, as_json)
    snapshot = session.store.stats()
    if as_json:
        emit_json(stats_record(snapshot, namespace))
        return
    now = snapshot.now_ms
    summary = Table(
        title=f"delay_broker store, namespace {printable(namespace)!r}", show_header=False, title_justify="left"
    )
    summary.add_column("measure")
    summary.add_column("value", justify="right")
    summary.add_column("note")
    summary.add_row("parked", f"{snapshot.parked:,}", "")
    summary.add_row("in flight", f"{snapshot.inflight:,}", "claimed by a promoter, not yet acknowledged")
    summary.add_row("dead", f"{snapshot.dead:,}", "see: delay-broker dead ls" if snapshot.dead else "")
    summary.add_row("overdue", f"{snapshot.overdue:,}", "due but not yet promoted")
    age = snapshot.oldest_overdue_age_ms
    summary.add_row("oldest overdue age", format_span(age) if snapshot.overdue else "-", "")
    next_due = snapshot.next_due_ms
    summary.add_row("next due", format_time(next_due), format_relative(next_due, now) if next_due else "nothing parked")
    promoter_note = "no promoter running: nothing will be promoted" if snapshot.live_promoters == 0 else ""
    summary.add_row("live promoters", str(snapshot.live_promoters), Text(promoter_note, style="bold red"))
    summary.add_row("Redis time", format_time(now), "")
    summary.add_row("store", describe_client(session.store.client), f"{snapshot.shards} shard(s)")

    rows = histogram_rows(snapshot)
    largest = max((count for _, _, count in rows), default=0)
    histogram = Table(title="parked messages by due time", title_justify="left")
    histogram.add_column("due")
    histogram.add_column("messages", justify="right")
    histogram.add_column("", min_width=10)
    for key, label, count in rows:
        histogram.add_row(label, f"{count:,}", Text(bar(count, largest), style="red" if key == "overdue" else "cyan"))

    counters = Table(title="store-wide counters (all time)", title_justify="left")
    counters.add_column("event")
    counters.add_column("total", justify="right")
    for name, total in sorted(snapshot.counters.items()):
        counters.add_row(cell(name), f"{total:,}")
    if not snapshot.counters:
        counters.add_row("(none yet)", "")
    session.console.print(Group(summary, Text(""), histogram, Text(""), counters))


# -- ls / show ---------------------------------------------------------------------------------------------------


def page_options(func: F) -> F:
    func = click.option(
        "--limit", type=click.IntRange(1, MAX_PAGE), default=50, show_default=True, help="Messages per page."
    )(func)
    func = click.option(
        "--offset", type=click.IntRange(min=0), default=0, show_default=True, help="Skip this many (next page)."
    )(func)
    func = click.option(
        "--to",
        "end",
        metavar="WHEN",
        help="Latest time shown: ISO 8601 (UTC unless it has an offset), 'now', or relative: 30m, -1h, 2d.",
    )(func)
    func = click.option(
        "--from",
        "start",
        metavar="WHEN",
        help="Earliest time shown: ISO 8601 (UTC unless it has an offset), 'now', or relative: 5m, -2h, 3d.",
    )(func)
    return func


def list_page(
    session: Session,
    state: ListState,
    start: str | None,
    end: str | None,
    offset: int,
    limit: int,
) -> None:
    now = session.store.now_ms()
    try:
        start_ms = None if start is None else parse_when(start, now)
        end_ms = None if end is None else parse_when(end, now)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--from/--to") from None
    if start_ms is not None and end_ms is not None and start_ms > end_ms:
        raise click.BadParameter("--from is after --to", param_hint="--from/--to")
    infos = session.store.list_messages(state, start_ms=start_ms, end_ms=end_ms, offset=offset, count=limit)
    more = len(infos) == limit
    if session.as_json:
        emit_json(
            {
                "namespace": session.namespace,
                "state": state,
                "from_ms": start_ms,
                "to_ms": end_ms,
                "offset": offset,
                "limit": limit,
                "next_offset": offset + len(infos) if more else None,
                "messages": [message_record(info) for info in infos],
            }
        )
        return
    time_column = TIME_COLUMN[state]
    table = Table(
        title=f"{STATE_WORDS[state]} messages, namespace {printable(session.namespace)!r}", title_justify="left"
    )
    table.add_column("id", overflow="fold")
    table.add_column(time_column, no_wrap=True)
    table.add_column("", no_wrap=True)
    table.add_column("framework")
    table.add_column("queue", overflow="fold")
    table.add_column("name", overflow="fold")
    table.add_column("attempts", justify="right")
    if state == "dead":
        table.add_column("error", overflow="fold")
    for info in infos:
        envelope = info.envelope
        when = info.due_ms if state == "due" else info.at_ms
        row = [
            cell(info.id),
            cell(format_time(when)),
            cell(format_relative(when, now)),
            cell(envelope.framework if envelope else "(corrupt)"),
            cell(envelope.route if envelope else None),
            cell(envelope.name if envelope else None),
            cell(info.attempts),
        ]
        if state == "dead":
            row.append(cell(info.error))
        table.add_row(*row)
    console = session.console
    if not infos:
        console.print(f"No {STATE_WORDS[state]} messages" + (" in that range." if start or end else "."))
        if offset:
            console.print(f"(offset {offset}: past the last page?)")
        return
    console.print(table)
    shown = f"Showing {offset + 1}-{offset + len(infos)}"
    if more:
        shown += f"; next page: --offset {offset + len(infos)}"
    console.print(shown + ". Details of one: delay-broker " + ("dead show ID" if state == "dead" else "show ID"))


@cli.command("ls", short_help="List parked (or inflight / dead) messages, oldest first, by due range.")
@click.argument("state", type=click.Choice(["due", "inflight", "dead"]), default="due", required=False)
@page_options
@store_options
@reports_errors
def ls(
    state: ListState,
    start: str | None,
    end: str | None,
    offset: int,
    limit: int,
    redis_url: str | None,
    namespace: str,
    as_json: bool,
) -> None:
    """List messages of one STATE, oldest first: due (parked, the default; ordered by due time), inflight
    (claimed by a promoter; by lease deadline) or dead (dead-lettered; by when they died).

    Columns: id, due time, framework, queue (the route it will be delivered to), name (actor or task), and
    failed delivery attempts. --from/--to filter on the time the list is ordered by.

    \b
    Examples:
      delay-broker ls                            the next 50 messages to become due
      delay-broker ls --to 1h                    everything due within the hour (and overdue ones)
      delay-broker ls --from 2030-01-01 --to 2030-01-02T06:00Z --limit 200
      delay-broker ls --offset 50                the next page
      delay-broker ls inflight --json
    """
    session = open_session(redis_url, namespace, as_json)
    list_page(session, state, start, end, offset, limit)


def show_message(session: Session, info: MessageInfo) -> None:
    record = message_record(info, with_payload=True)
    if session.as_json:
        emit_json(record)
        return
    store_now = session.store.now_ms()
    details = Table(show_header=False, title=f"message {printable(info.id)!r}", title_justify="left")
    details.add_column("field", style="bold")
    details.add_column("value", overflow="fold")
    details.add_row("state", STATE_WORDS.get(info.state, info.state))
    if info.due_ms is not None:
        details.add_row("due", f"{format_time(info.due_ms)} ({format_relative(info.due_ms, store_now)})")
    if info.state == "inflight":
        expired = info.at_ms is not None and info.at_ms < store_now
        note = "; expired: the next promoter to claim gives it back" if expired else ""
        details.add_row("lease until", f"{format_time(info.at_ms)} ({format_relative(info.at_ms, store_now)}{note})")
    if info.state == "dead":
        details.add_row("dead since", f"{format_time(info.at_ms)} ({format_relative(info.at_ms, store_now)})")
    details.add_row("attempts", str(info.attempts))
    if info.error:
        details.add_row("last error", cell(info.error))
    envelope = info.envelope
    blocks: list[Any] = [details]
    if envelope is None:
        details.add_row("envelope", Text("corrupt: not an envelope this version can read", style="bold red"))
        raw = info.raw or b""
        blocks.append(Text(escape_bytes(raw)))
        print_blocks(session.console, blocks)
        return
    details.add_row("framework", cell(envelope.framework))
    details.add_row("queue (route)", cell(envelope.route))
    details.add_row("name", cell(envelope.name))
    if envelope.hash_field:
        details.add_row("hash field", cell(envelope.hash_field))
    if envelope.parked_at_ms:
        details.add_row("parked at", format_time(envelope.parked_at_ms))
    if envelope.extra:
        details.add_row("extra", cell(json.dumps(envelope.extra, ensure_ascii=False)))
    payload = record["payload"]
    details.add_row("payload", f"{payload['size']:,} bytes, {payload['format']}")
    if payload["format"] == "json":
        blocks.append(Text("payload (the framework's message):", style="bold"))
        blocks.append(json_block(payload["message"]))
        body = payload.get("body")
        if isinstance(body, dict):
            kind = body.get("content_type") or "unknown content type"
            note = f" - {body['note']}" if body.get("note") else ""
            blocks.append(Text(f"Celery message body, decoded ({printable(str(kind))}){note}:", style="bold"))
            if body["format"] == "json":
                blocks.append(json_block(body["value"]))
            else:
                blocks.append(Text(printable(str(body.get("text", body.get("escaped", ""))), keep_newlines=True)))
    elif payload["format"] == "text":
        blocks.append(Text("payload (text, not JSON):", style="bold"))
        blocks.append(Text(printable(payload["text"], keep_newlines=True)))
    else:
        blocks.append(Text("payload (binary, escaped; --json gives it in base64):", style="bold"))
        blocks.append(Text(payload["escaped"]))
    print_blocks(session.console, blocks)


def print_blocks(console: Console, blocks: Sequence[Any]) -> None:
    for block in blocks:
        console.print(block)


def json_block(value: Any) -> Syntax:
    text = printable(json.dumps(value, indent=2, ensure_ascii=False, default=str), keep_newlines=True)
    return Syntax(text, "json", word_wrap=True, background_color="default", theme="ansi_dark")


@cli.command(short_help="Show one message: state, due time, attempts, envelope and decoded payload.")
@click.argument("id")
@store_options
@reports_errors
def show(id: str, redis_url: str | None, namespace: str, as_json: bool) -> None:
    """Show message ID whatever its state: due time, lease or dead-letter time, attempts, last error, where it
    will be delivered, and its payload decoded.

    A JSON payload is shown as the framework's message (Dramatiq: the message with actor, args, kwargs and
    options; Celery: what kombu published, with its body decoded from base64 and JSON when it is). Anything
    else is shown as text or escaped bytes; nothing is ever unpickled or evaluated. --json adds the raw
    payload in base64.
    """
    session = open_session(redis_url, namespace, as_json)
    show_message(session, get_message(session, id))


# -- cancel / reschedule -----------------------------------------------------------------------------------------


def describe(info: MessageInfo) -> str:
    envelope = info.envelope
    what = f"{envelope.framework} {envelope.name or envelope.route}" if envelope else "corrupt envelope"
    when = f", due {format_time(info.due_ms)}" if info.state == "due" else ""
    return f"{printable(info.id)!r} ({printable(what)}{when}, {STATE_WORDS[info.state]})"


@cli.command(short_help="Delete a parked message for good (asks first).")
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


@cli.command(short_help="Move a parked message: --in 5m, --at ISO-TIME or --now.")
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
            from .celery.messages import reschedule_parked
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


# -- dead letters ------------------------------------------------------------------------------------------------


@cli.group(cls=OrderedGroup, short_help="Dead-lettered messages: ls, show, requeue, purge.")
def dead() -> None:
    """Dead-lettered messages: ones a promoter could not deliver (refused, unknown queue, out of attempts).

    \b
      delay-broker dead ls                   list them, with the error that killed each
      delay-broker dead show ID              one of them, decoded
      delay-broker dead requeue ID [ID...]   park them again, due now, attempts reset
      delay-broker dead requeue --all        all of them (asks first)
      delay-broker dead purge [ID...]        delete them for good; all without IDs (asks first)
    """


@dead.command("ls", short_help="List dead-lettered messages with their last error.")
@page_options
@store_options
@reports_errors
def dead_ls(
    start: str | None,
    end: str | None,
    offset: int,
    limit: int,
    redis_url: str | None,
    namespace: str,
    as_json: bool,
) -> None:
    """List dead-lettered messages, oldest first, with the error that dead-lettered each. --from/--to filter on
    when they were dead-lettered (e.g. --from -1h: the last hour)."""
    session = open_session(redis_url, namespace, as_json)
    list_page(session, "dead", start, end, offset, limit)


@dead.command("show", short_help="Show one dead-lettered message, decoded.")
@click.argument("id")
@store_options
@reports_errors
def dead_show(id: str, redis_url: str | None, namespace: str, as_json: bool) -> None:
    """Show dead-lettered message ID: its last error, attempts, envelope and decoded payload."""
    session = open_session(redis_url, namespace, as_json)
    info = get_message(session, id)
    if info.state != "dead":
        raise click.ClickException(f"message {describe(info)} is not dead-lettered (see it with: delay-broker show ID)")
    show_message(session, info)


@dead.command("requeue", short_help="Send dead-lettered messages again (IDs, or --all).")
@click.argument("ids", nargs=-1, metavar="[ID]...")
@click.option("--all", "all_", is_flag=True, help="Requeue every dead-lettered message (asks first).")
@confirm_option
@store_options
@reports_errors
def dead_requeue(
    ids: Sequence[str], all_: bool, yes: bool, redis_url: str | None, namespace: str, as_json: bool
) -> None:
    """Park dead-lettered messages again, due now, with their attempts reset: the promoter delivers them at
    once. Give IDs, or --all (which asks for confirmation, and refuses without --yes when not at a terminal).

    Fix what killed them first (see: delay-broker dead ls), or they die again.
    """
    if bool(ids) == all_:
        raise click.UsageError("give the IDs of dead-lettered messages, or --all")
    session = open_session(redis_url, namespace, as_json)
    missing: list[str] = []
    if all_:
        count = session.store.stats().dead
        if count == 0:
            requeued = 0
        else:
            confirm(
                f"requeue all {count:,} dead-lettered messages",
                f"Requeue all {count:,} dead-lettered messages in namespace {namespace!r}? They run again.",
                yes,
            )
            requeued = session.store.requeue_dead(None).count
    else:
        result = session.store.requeue_dead(list(dict.fromkeys(ids)))
        requeued, missing = result.count, result.not_requeued
    if as_json:
        emit_json({"requeued": requeued, "not_requeued": missing})
    else:
        session.console.print(f"Requeued {requeued:,} message(s): due now.")
    if missing:
        shown = ", ".join(repr(printable(id)) for id in missing[:20])
        click.echo(f"Not requeued (not dead-lettered, or no payload): {shown}", err=True)
        sys.exit(1)


@dead.command("purge", short_help="Delete dead-lettered messages for good (IDs, or all; asks first).")
@click.argument("ids", nargs=-1, metavar="[ID]...")
@confirm_option
@store_options
@reports_errors
def dead_purge(ids: Sequence[str], yes: bool, redis_url: str | None, namespace: str, as_json: bool) -> None:
    """Delete dead-lettered messages for good: the given IDs, or all of them when no ID is given.

    Asks for confirmation; when not at a terminal, refuses unless --yes is given.
    """
    session = open_session(redis_url, namespace, as_json)
    if ids:
        what = f"{len(set(ids))} dead-lettered message(s)"
        count = len(ids)
    else:
        count = session.store.stats().dead
        what = f"all {count:,} dead-lettered messages in namespace {namespace!r}"
    purged = 0
    if count:
        confirm(f"purge {what}", f"Delete {what} for good?", yes)
        purged = session.store.purge_dead(list(dict.fromkeys(ids)) if ids else None)
    if as_json:
        emit_json({"purged": purged})
    else:
        session.console.print(f"Purged {purged:,} dead-lettered message(s).")


# -- promote / metrics --------------------------------------------------------------------------------------------


def build_app_promoter(dramatiq_broker: str | None, celery_app: str | None, overrides: dict[str, Any]) -> Any:
    """The application's promoter, built by its adapter from ``MODULE:NAME``."""
    from .cli import import_object

    if dramatiq_broker is not None:
        from . import dramatiq as adapter

        return adapter.build_promoter(import_object(dramatiq_broker), **overrides)
    from . import celery as celery_adapter

    return celery_adapter.build_promoter(import_object(celery_app or ""), **overrides)


@cli.command(short_help="Run a standalone promoter for a Dramatiq broker or a Celery app.")
@click.option("--dramatiq", "dramatiq_broker", metavar="MODULE:BROKER", help="Promote for this Dramatiq broker.")
@click.option("--celery", "celery_app", metavar="MODULE:APP", help="Promote for this Celery app.")
@click.option("--batch", type=click.IntRange(1, 1000), default=None, help="Messages per claim (1-1000).")
@click.option("--lease", type=click.FloatRange(min=1), default=None, help="Seconds a claimed message is held.")
@click.option("--max-idle", type=click.FloatRange(min=0.1), default=None, help="Longest sleep in seconds.")
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve Prometheus metrics (promoter counters and the store's backlog) on this port, at /metrics.",
)
@click.option(
    "--metrics-addr", default="0.0.0.0", show_default=True, metavar="ADDRESS", help="Address the metrics server binds."
)
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default="INFO",
    show_default=True,
    help="Level of the delay_broker log lines (start/stop, Redis lost/regained, dead letters).",
)
def promote(
    dramatiq_broker: str | None,
    celery_app: str | None,
    batch: int | None,
    lease: float | None,
    max_idle: float | None,
    metrics_port: int | None,
    metrics_addr: str,
    log_level: str,
) -> None:
    """Run a standalone promoter until interrupted (Ctrl-C / SIGTERM stop it gracefully).

    Give the application to promote for, as an importable MODULE:NAME; the promoter uses that app's own
    delay_broker settings (Redis, namespace) and delivers into its queues. Run as many as you like: they
    share the work.

    \b
    Examples:
      delay-broker promote --dramatiq myapp.tasks:broker
      delay-broker promote --celery myapp.celery:app --metrics-port 9871 --log-level WARNING
    """
    if (dramatiq_broker is None) == (celery_app is None):
        raise click.UsageError("give exactly one of --dramatiq MODULE:BROKER and --celery MODULE:APP")
    from .cli import configure_logging, run_until_signalled

    configure_logging(log_level)
    overrides = {
        name: value for name, value in (("batch", batch), ("lease", lease), ("max_idle", max_idle)) if value is not None
    }
    promoter = build_app_promoter(dramatiq_broker, celery_app, overrides)
    server = None
    if metrics_port is not None:
        from .metrics import ListenerChain, PromoterMetrics, start_metrics_server

        try:
            metrics = PromoterMetrics.for_store(promoter.store)
            promoter.listener = ListenerChain(promoter.listener, metrics) if promoter.listener else metrics
            server = start_metrics_server(metrics_port, promoter.store, addr=metrics_addr)
        except (DelayBrokerError, OSError) as error:
            raise click.ClickException(f"cannot serve metrics on {metrics_addr}:{metrics_port}: {error}") from None
    try:
        run_until_signalled(promoter, log_level=None)
    finally:
        if server is not None:
            server.stop()


@cli.command("metrics", short_help="Serve the store's Prometheus metrics (backlog, overdue, dead) over HTTP.")
@click.option("--port", type=click.IntRange(0, 65535), default=9871, show_default=True, help="HTTP port.")
@click.option("--addr", default="0.0.0.0", show_default=True, metavar="ADDRESS", help="Address to bind.")
@click.option("--print", "print_once", is_flag=True, help="Print one scrape to stdout and exit (no server).")
@click.option(
    "--namespace",
    "-n",
    "namespaces",
    multiple=True,
    envvar="DELAY_BROKER_NAMESPACE",
    show_envvar=True,
    help="Store namespace (Dramatiq's default: default; Celery's: celery); repeat for several.  [default: default]",
)
@click.option(
    "--redis-url",
    "-r",
    envvar="DELAY_BROKER_REDIS_URL",
    show_envvar=True,
    metavar="URL",
    help="Redis holding the delay store, e.g. redis://localhost:6379/0.",
)
@reports_errors
def metrics_command(port: int, addr: str, print_once: bool, namespaces: Sequence[str], redis_url: str | None) -> None:
    """Serve Prometheus metrics read from the store at each scrape (parked, in flight, dead, overdue,
    oldest-overdue age, live promoters, counters), until interrupted. Useful where no promoter exposes
    metrics, e.g. when promoters run inside Dramatiq or Celery workers.

    \b
    Examples:
      delay-broker metrics --redis-url redis://localhost:6379/0 --port 9871
      delay-broker metrics -n billing -n mail --print
    """
    from .metrics import StoreCollector, prometheus, start_metrics_server

    chosen = list(dict.fromkeys(namespaces)) or [DEFAULT_NAMESPACE]
    sessions = [open_session(redis_url, namespace, False) for namespace in chosen]
    stores = [session.store for session in sessions]
    try:
        prom = prometheus()
    except DelayBrokerError as error:
        raise click.ClickException(str(error)) from None
    if print_once:
        registry = prom.CollectorRegistry()
        registry.register(StoreCollector(stores))
        click.echo(prom.generate_latest(registry).decode(), nl=False)
        return
    from .cli import configure_logging

    configure_logging("INFO")
    try:
        server = start_metrics_server(port, stores, addr=addr)
    except OSError as error:
        raise click.ClickException(f"cannot serve metrics on {addr}:{port}: {error}") from None
    click.echo(f"Serving metrics of namespace(s) {', '.join(chosen)} on {server.url} (Ctrl-C stops).", err=True)
    wait_for_signal()
    server.stop()


def wait_for_signal() -> None:
    """Block until SIGINT or SIGTERM."""
    from .cli import on_stop_signals  # imported here: delay_broker.cli imports this module

    stopped = threading.Event()
    with on_stop_signals(stopped.set):
        while not stopped.wait(1.0):
            pass


# -- demo ------------------------------------------------------------------------------------------------------------


@cli.command(short_help="See it work: a Dramatiq app with and without delay_broker on a private Redis.")
@click.option("--redis-url", envvar="DELAY_BROKER_REDIS_URL", help="Use this Redis instead of a private one.")
@click.option("--messages", default=3000, show_default=True, help="How many delayed messages to send.")
@click.option("--seconds", default=4.0, show_default=True, help="How long sending takes.")
@click.option("--max-delay", default=8.0, show_default=True, help="Longest delay in seconds (shortest: 2 s).")
@click.option("--lists", is_flag=True, help="Framework-free variant: park and promote into plain Redis lists.")
def demo(redis_url: str | None, messages: int, seconds: float, max_delay: float, lists: bool) -> None:
    """Send delayed messages to a Dramatiq worker with delay_broker and to a plain Dramatiq worker, side by
    side, and compare: executed, duplicates, lost, lateness, and the workers' memory.

    Without --redis-url it starts a private redis-server on a free port in a temporary directory. The delays
    are above the demo's 1 s threshold, so delay_broker parks every message in Redis while plain Dramatiq
    holds them in the worker until they are due.
    """
    from .embedded import EmbeddedRedis

    console = Console()
    server = None if redis_url else EmbeddedRedis().start()
    try:
        url = redis_url or server.url  # type: ignore[union-attr]
        where = redis_url or f"a private redis-server on port {server.port}"  # type: ignore[union-attr]
        if lists:
            _lists_demo(console, url, where, messages, seconds)
        else:
            _dramatiq_demo(console, url, where, messages, seconds, max_delay)
    finally:
        if server is not None:
            server.close()


def _dramatiq_demo(console: Console, url: str, where: str, messages: int, seconds: float, max_delay: float) -> None:
    from rich.live import Live

    from .demo.dramatiq_run import run_dramatiq_demo

    console.print(
        f"Sending {messages} messages delayed 2-{max_delay:.0f} s over {seconds:.0f} s to two Dramatiq workers "
        f"on {where}: one with delay_broker, one without."
    )

    def view(counts: dict[str, int]) -> Table:
        table = Table(show_header=False, box=None)
        for name, value in counts.items():
            table.add_row(name, f"{value:>7}", "█" * int(30 * value / max(messages, 1)))
        return table

    with Live(view({}), console=console, refresh_per_second=8) as live:
        report = run_dramatiq_demo(
            url,
            messages=messages,
            send_seconds=seconds,
            min_delay=2.0,
            max_delay=max(max_delay, 2.5),
            progress=lambda counts: live.update(view(counts)),
        )
    table = Table(title="delay-broker demo")
    table.add_column("measure")
    table.add_column("with delay_broker", justify="right")
    table.add_column("plain Dramatiq", justify="right")
    for row in report.rows():
        table.add_row(*row)
    console.print(table)
    if not report.ok:
        sys.exit(1)


def _lists_demo(console: Console, url: str, where: str, messages: int, seconds: float) -> None:
    from .demo.lists import run_list_demo

    console.print(f"Parking {messages} messages due over {seconds:.0f} s on {where} ...")
    report = run_list_demo(redis.Redis.from_url(url), messages=messages, spread=seconds, promoters=2)
    table = Table(title="delay-broker demo (plain lists)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for name, value in report.rows():
        table.add_row(name, value)
    console.print(table)
    if report.duplicates or report.lost:
        sys.exit(1)


# Command groups of their own modules register themselves on ``cli`` when imported.
from . import cli_cron  # noqa: E402, F401
