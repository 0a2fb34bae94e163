"""``stats``, ``ls`` and ``show``: what the store holds."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import click
from rich.console import Console, Group
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from ..connect import describe as describe_client
from ..decoding import escape_bytes
from ..operations import MessageFilter, Operations
from ..store import MessageInfo, StoreStats
from .common import (
    MAX_PAGE,
    STATE_WORDS,
    TIME_COLUMN,
    F,
    FilterArgs,
    ListState,
    Session,
    cell,
    emit_json,
    filter_options,
    get_message,
    open_session,
    reports_errors,
    store_options,
)
from .format import (
    bar,
    describe_filter,
    format_relative,
    format_span,
    format_time,
    histogram_rows,
    message_record,
    printable,
    stats_record,
)

# -- stats -----------------------------------------------------------------------------------------------------------


@click.command(short_help="Counts: parked, overdue, in flight, dead, live promoters; due-time histogram.")
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
        title=Text(f"delay_broker store, namespace {printable(namespace)!r}"), show_header=False, title_justify="left"
    )
    summary.add_column("measure")
    summary.add_column("value", justify="right")
    summary.add_column("note")
    notes = [f"{snapshot.packed:,} of them in packs"] if snapshot.packed else []
    if session.store.far_tier:
        notes.append(f"{snapshot.far:,} {'' if notes else 'of them '}in the far tier (PostgreSQL)")
    summary.add_row("parked", f"{snapshot.parked:,}", ", ".join(notes))
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
    if unused(snapshot):
        session.console.print(Text(empty_namespace_hint(session)))


def unused(snapshot: StoreStats) -> bool:
    """Whether nothing was ever parked in the namespace and nothing holds it now: no message, no counter, no
    promoter's heartbeat. Zeros then mean the wrong namespace or Redis far more often than an idle one."""
    return not (snapshot.parked or snapshot.inflight or snapshot.dead or snapshot.counters or snapshot.live_promoters)


def empty_namespace_hint(session: Session) -> str:
    return (
        f"Namespace {printable(session.namespace)!r} holds nothing: no message was ever parked in it here, and no "
        "promoter serves it. If your application parks messages, check --namespace (Dramatiq's default is "
        "'default', Celery's 'celery') and that --redis-url names the same Redis and database (/0, /1 ...)."
    )


# -- ls / show ---------------------------------------------------------------------------------------------------


def page_options(func: F) -> F:
    func = click.option(
        "--limit", type=click.IntRange(1, MAX_PAGE), default=50, show_default=True, help="Messages per page."
    )(func)
    func = click.option(
        "--offset",
        type=click.IntRange(min=0),
        default=0,
        show_default=True,
        help="Skip this many from the head. Messages promoted meanwhile shift it, so pages by offset skip some: "
        "page with --cursor.",
    )(func)
    func = click.option("--cursor", metavar="CURSOR", help="The next page: the cursor printed under the page before.")(
        func
    )
    return func


def list_page(
    session: Session, state: ListState, filters: FilterArgs, offset: int, limit: int, cursor: str | None
) -> None:
    now = session.store.now_ms()
    filter = filters.to_filter(session, state)
    # Queue, task, id and text filters go through the operations layer; a time window alone is a plain range.
    filtered = any((filters.queue, filters.task, filters.id_prefix, filters.text, cursor))
    # By cursor unless an offset is asked for: an offset counts from the head, which promotions move meanwhile,
    # so the next page by offset skips messages (a cursor holds the position of the last one shown).
    by_cursor = filtered or not offset
    next_cursor: str | None = None
    if by_cursor:
        infos, next_cursor = find_page(session, filter, offset, limit, cursor)
        more = next_cursor is not None
    else:
        infos = session.store.list_messages(
            state, start_ms=filter.start_ms, end_ms=filter.end_ms, offset=offset, count=limit, headers_only=True
        )
        more = len(infos) == limit
    if session.as_json:
        record: dict[str, Any] = {
            "namespace": session.namespace,
            "state": state,
            "from_ms": filter.start_ms,
            "to_ms": filter.end_ms,
            "offset": offset,
            "limit": limit,
            "next_offset": offset + len(infos) if more and not filtered else None,
            "messages": [message_record(info) for info in infos],
        }
        if by_cursor:
            record.update(next_cursor=next_cursor)
        if filtered:
            record.update(filter=describe_filter(filter))
        emit_json(record)
        return
    if not infos:
        ending = " match." if filtered else " in that range." if filters.windowed else "."
        print_nothing_found(session, f"No {STATE_WORDS[state]} messages{ending}", offset, cursor)
        return
    session.console.print(message_table(session, state, infos, now))
    shown = f"Showing {len(infos)} matching {describe_filter(filter)}" if filtered else f"Showing {len(infos)}"
    if not by_cursor:
        shown = f"Showing {offset + 1}-{offset + len(infos)}"
    # Text, not markup: the filter's values are the user's, and may hold rich's brackets.
    details = "dead show ID" if state == "dead" else "show ID"
    session.console.print(Text(f"{shown}. Details of one: delay-broker {details}"))
    if more:
        # Last, on a line of its own that the terminal may wrap but rich does not break: the cursor is copied whole.
        following = f"--offset {offset + len(infos)}" if not by_cursor else f"--cursor {next_cursor}"
        session.console.print(Text(f"Next page: {following}"), soft_wrap=True)


def find_page(
    session: Session, filter: MessageFilter, offset: int, limit: int, cursor: str | None
) -> tuple[list[MessageInfo], str | None]:
    """A page through the operations layer: a bounded scan, page after page by cursor (an offset would rescan).
    Returns its messages and the cursor of the next page (None: the last)."""
    if offset:
        raise click.UsageError("with --queue/--task/--id-prefix/--text, page with --cursor, not --offset")
    try:
        page = Operations(session.store).find(filter, cursor=cursor, limit=limit, headers_only=True)
    except UnicodeEncodeError:
        raise  # a filter's text Redis cannot take, not the cursor: reports_errors says so
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--cursor") from None
    return page.messages, page.cursor


def print_nothing_found(session: Session, message: str, offset: int, cursor: str | None) -> None:
    """An empty page, and the likeliest reason when it is not a filter's: past the end, or the wrong namespace."""
    session.console.print(message)
    if offset:
        session.console.print(f"(offset {offset}: past the last page?)")
    elif not cursor and unused(session.store.stats()):
        session.console.print(Text(empty_namespace_hint(session)))


def message_table(session: Session, state: ListState, infos: Sequence[MessageInfo], now: int) -> Table:
    """A page of messages as a table whose ids never wrap, so that one can be copied into show, cancel or
    reschedule: no rules between the columns, the framework only when the page holds both (else the title names
    it) and failed attempts only when some message on the page has any, leave a whole UUID room beside its due
    time in a 100-column terminal. The other columns wrap."""
    frameworks = {info.envelope.framework if info.envelope else "(corrupt)" for info in infos}
    attempts = state != "due" or any(info.attempts for info in infos)
    title = f"{STATE_WORDS[state]} messages, namespace {printable(session.namespace)!r}"
    if len(frameworks) == 1:
        title += f", all {printable(next(iter(frameworks)))}"
    table = Table(title=Text(title), title_justify="left", box=None, pad_edge=False)
    table.add_column("id", no_wrap=True, min_width=max((len(info.id) for info in infos), default=2))
    table.add_column(TIME_COLUMN[state], no_wrap=True)
    table.add_column("", no_wrap=True)
    if len(frameworks) > 1:
        table.add_column("framework", no_wrap=True)
    table.add_column("queue", overflow="fold")
    table.add_column("name", overflow="fold")
    if attempts:
        table.add_column("attempts", justify="right")
    if state == "dead":
        table.add_column("error", overflow="fold")
    for info in infos:
        envelope = info.envelope
        when = info.due_ms if state == "due" else info.at_ms
        row = [cell(info.id), cell(format_time(when)), cell(format_relative(when, now))]
        if len(frameworks) > 1:
            row.append(cell(envelope.framework if envelope else "(corrupt)"))
        row += [cell(envelope.route if envelope else None), cell(envelope.name if envelope else None)]
        if attempts:
            row.append(cell(info.attempts))
        if state == "dead":
            row.append(cell(info.error))
        table.add_row(*row)
    return table


@click.command("ls", short_help="List parked (or inflight / dead) messages, oldest first, by due range.")
@click.argument("state", type=click.Choice(["due", "inflight", "dead"]), default="due", required=False)
@page_options
@filter_options
@store_options
@reports_errors
def ls(
    state: ListState,
    offset: int,
    limit: int,
    cursor: str | None,
    filters: FilterArgs,
    redis_url: str | None,
    namespace: str,
    as_json: bool,
) -> None:
    """List messages of one STATE, oldest first: due (parked, the default; ordered by due time), inflight
    (claimed by a promoter; by lease deadline) or dead (dead-lettered; by when they died).

    Columns: id, due time, framework (when the page holds both), queue (the route it will be delivered to),
    name (actor or task), and failed delivery attempts (when any message shown has some). --from/--to filter on
    the time the list is ordered by.

    \b
    Examples:
      delay-broker ls                            the next 50 messages to become due
      delay-broker ls --to 1h                    everything due within the hour (and overdue ones)
      delay-broker ls --from 2030-01-01 --to 2030-01-02T06:00Z --limit 200
      delay-broker ls --cursor CURSOR            the next page (each page ends with its cursor)
      delay-broker ls inflight --json
      delay-broker ls --queue emails --task send_welcome --to 1d
      delay-broker ls --text acme-corp            a search in the decoded messages (arguments)
      delay-broker ls dead --queue payments

    Pages go on with --cursor, which holds where the page before stopped: messages promoted meanwhile do not
    shift it (as they shift --offset), and --queue, --task, --id-prefix and --text scan the store in bounded
    steps, so a page costs the same at the start of a million messages as anywhere else.
    """
    session = open_session(redis_url, namespace, as_json)
    list_page(session, state, filters, offset, limit, cursor)


def show_message(session: Session, info: MessageInfo) -> None:
    record = message_record(info, with_payload=True)
    if session.as_json:
        emit_json(record)
        return
    store_now = session.store.now_ms()
    details = Table(show_header=False, title=Text(f"message {printable(info.id)!r}"), title_justify="left")
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


@click.command(short_help="Show one message: state, due time, attempts, envelope and decoded payload.")
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


COMMANDS = [stats, ls, show]
"""This module's commands, in the order ``delay-broker --help`` lists them."""
