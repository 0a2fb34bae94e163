"""``delay-broker dead``: dead-lettered messages (ls, show, requeue, purge)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click

from .actions import describe
from .common import (
    FilterArgs,
    OrderedGroup,
    act_on_filter,
    confirm,
    confirm_option,
    emit_json,
    filter_options,
    get_message,
    open_session,
    reports_errors,
    store_options,
)
from .format import printable
from .inspect import list_page, page_options, show_message

# -- dead letters ------------------------------------------------------------------------------------------------


@click.group(cls=OrderedGroup, short_help="Dead-lettered messages: ls, show, requeue, purge.")
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
@filter_options
@store_options
@reports_errors
def dead_ls(
    offset: int,
    limit: int,
    cursor: str | None,
    filters: FilterArgs,
    redis_url: str | None,
    namespace: str,
    as_json: bool,
) -> None:
    """List dead-lettered messages, oldest first, with the error that dead-lettered each. --from/--to filter on
    when they were dead-lettered (e.g. --from -1h: the last hour); --queue, --task, --id-prefix and --text as
    for ls."""
    session = open_session(redis_url, namespace, as_json)
    list_page(session, "dead", filters, offset, limit, cursor)


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


@dead.command("requeue", short_help="Send dead-lettered messages again (IDs, --all, or a filter).")
@click.argument("ids", nargs=-1, metavar="[ID]...")
@click.option("--all", "all_", is_flag=True, help="Requeue every dead-lettered message (asks first).")
@filter_options
@confirm_option
@store_options
@reports_errors
def dead_requeue(
    ids: Sequence[str],
    all_: bool,
    filters: FilterArgs,
    yes: bool,
    redis_url: str | None,
    namespace: str,
    as_json: bool,
) -> None:
    """Park dead-lettered messages again, due now, with their attempts reset: the promoter delivers them at
    once. Give IDs, --all, or a filter (--queue, --task, --id-prefix, --text, --from/--to on when they died);
    --all and filters ask for confirmation, and refuse without --yes when not at a terminal.

    Fix what killed them first (see: delay-broker dead ls), or they die again.
    """
    if sum((bool(ids), all_, filters.given)) != 1:
        raise click.UsageError("give the IDs of dead-lettered messages, --all, or a filter (--queue, --task, ...)")
    session = open_session(redis_url, namespace, as_json)
    if act_on_filter(session, ids, filters, "dead", yes, "requeue", lambda ops, chosen: ops.requeue(chosen)):
        return
    missing: list[str] = []
    if all_:
        # The clock before the count: what is done is at most what the operator confirmed, never letters that
        # died after the question (nor, while their cause lasts, those requeued here that die again).
        dead_by = session.store.now_ms()
        count = session.store.stats().dead
        if count == 0:
            requeued = 0
        else:
            confirm(
                f"requeue all {count:,} dead-lettered messages",
                f"Requeue all {count:,} dead-lettered messages in namespace {namespace!r}? They run again.",
                yes,
            )
            result = session.store.requeue_dead(None, dead_by_ms=dead_by)
            requeued, missing = result.count, result.not_requeued
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


@dead.command("purge", short_help="Delete dead-lettered messages for good (IDs, a filter, or all; asks first).")
@click.argument("ids", nargs=-1, metavar="[ID]...")
@filter_options
@confirm_option
@store_options
@reports_errors
def dead_purge(
    ids: Sequence[str],
    filters: FilterArgs,
    yes: bool,
    redis_url: str | None,
    namespace: str,
    as_json: bool,
) -> None:
    """Delete dead-lettered messages for good: the given IDs, those matching a filter (--queue, --task,
    --id-prefix, --text, --from/--to on when they died), or all of them when neither is given.

    Asks for confirmation; when not at a terminal, refuses unless --yes is given.
    """
    session = open_session(redis_url, namespace, as_json)
    if act_on_filter(session, ids, filters, "dead", yes, "purge", lambda ops, chosen: ops.purge(chosen)):
        return
    if ids:
        what = f"{len(set(ids))} dead-lettered message(s)"
        count = len(ids)
    else:
        dead_by = session.store.now_ms()  # as for requeue --all: the letters counted, not those dying later
        count = session.store.stats().dead
        what = f"all {count:,} dead-lettered messages in namespace {namespace!r}"
    purged = 0
    unique = list(dict.fromkeys(ids))
    if count:
        confirm(f"purge {what}", f"Delete {what} for good?", yes)
        purged = session.store.purge_dead(unique) if ids else session.store.purge_dead(None, dead_by_ms=dead_by)
    if as_json:
        emit_json({"purged": purged})
    else:
        session.console.print(f"Purged {purged:,} dead-lettered message(s).")
    if ids and purged < len(unique):
        # The purge script counts what it deleted, it does not name what it left: say how many.
        left = len(unique) - purged
        click.echo(f"Not purged: {left:,} of the given IDs (not dead-lettered: unknown, parked or requeued)", err=True)
        sys.exit(1)


COMMANDS = [dead]
"""This module's commands, in the order ``delay-broker --help`` lists them."""
