"""``delay-broker cron``: recurring schedules, declared in code or managed at runtime (add, change, pause ...)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any, TypeVar, cast

import click
from rich.table import Table

from ..schedule_defs import ScheduleDefinition
from ..schedules import RuntimeSchedules, definition_fields, schedule_rows
from .common import (
    OrderedGroup,
    Session,
    cell,
    confirm,
    confirm_option,
    emit_json,
    open_session,
    report,
    reports_errors,
    store_options,
)
from .format import format_relative, format_time, parse_duration, parse_iso, printable

F = TypeVar("F", bound=Callable[..., Any])


@click.group(cls=OrderedGroup, short_help="Recurring schedules: ls, add, change, pause, resume, run-now, remove.")
def cron() -> None:
    """Recurring schedules: declared in code (DelayMiddleware.schedule, delay_broker.celery.schedule) or stored
    at runtime with these commands. Every promoter of the namespace runs both; each occurrence runs once.

    \b
      delay-broker cron ls                   schedules, their timing, state and next occurrence
      delay-broker cron add NAME --task T --cron "0 9 * * 1-5" [--args '[1]'] [--timezone Europe/Paris]
      delay-broker cron add NAME --task T --every 15m [--start ISO] [--end ISO]
      delay-broker cron change NAME --every 1h      re-time (also a schedule declared in code)
      delay-broker cron pause NAME / resume NAME    stop and restart its occurrences
      delay-broker cron run-now NAME                send its message once, now
      delay-broker cron remove NAME                 delete a stored schedule (asks first)
      delay-broker cron forget NAME                 drop a schedule's record and its parked occurrence

    --task is the Celery task name or the Dramatiq actor name; --args, --kwargs and --options are JSON.
    """


@cron.command("ls", short_help="List recurring schedules, their timing, state and next occurrence.")
@store_options
@reports_errors
def cron_ls(redis_url: str | None, namespace: str, as_json: bool) -> None:
    """List the recurring schedules of this namespace: those stored at runtime, and those declared in code that
    parked an occurrence; with the latest occurrence parked (the next to run, unless it was already promoted),
    its message id and its state."""
    session = open_session(redis_url, namespace, as_json)
    rows = schedule_rows(session.store)
    if as_json:
        emit_json({"schedules": rows})
        return
    if not rows:
        session.console.print("No recurring schedule is stored or has parked an occurrence in this namespace.")
        return
    now_ms = session.store.now_ms()
    table = Table("schedule", "source", "timing", "latest occurrence", "due in", "message id", "state", box=None)
    for row in rows:
        table.add_row(
            cell(row["name"]),
            row["source"],
            cell(row.get("problem") or row["timing"] or "(in code)"),
            format_time(row["due_ms"]),
            format_relative(row["due_ms"], now_ms),
            cell(row["id"]) if row["id"] else "-",
            "paused" if row["paused"] else row["state"],
        )
    session.console.print(table)


def _json_option(label: str) -> Callable[[str | None], Any]:
    def parse(text: str | None) -> Any:
        if text is None:
            return None
        try:
            return json.loads(text)
        except ValueError as error:
            raise click.BadParameter(f"not JSON: {error}", param_hint=label) from None

    return parse


def _instant(label: str, text: str | None) -> Any:
    if text is None:
        return None
    try:
        return parse_iso(text)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint=label) from None


def _every(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return parse_duration(text)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--every") from None


_SCHEDULE_OPTIONS = (
    click.option("--cron", metavar="EXPR", help='Cron expression, e.g. "0 9 * * 1-5" (6th field: seconds).'),
    click.option("--every", metavar="DURATION", help="Interval instead of cron: 30s, 15m, 1h, 1d ..."),
    click.option("--timezone", metavar="ZONE", help="IANA time zone of the cron expression (default UTC)."),
    click.option("--start", metavar="ISO-TIME", help="No occurrence before (UTC unless given); 'none' clears it."),
    click.option("--end", metavar="ISO-TIME", help="No occurrence after (UTC unless given); 'none' clears it."),
    click.option("--task", metavar="NAME", help="Celery task name or Dramatiq actor name to send."),
    click.option("--args", metavar="JSON", help="Positional arguments, a JSON list."),
    click.option("--kwargs", metavar="JSON", help="Keyword arguments, a JSON object."),
    click.option("--options", metavar="JSON", help="Message options, a JSON object (queue ...)."),
)


def schedule_options(func: F) -> F:
    """The timing and message options of ``cron add``/``cron change``, handed to the command as one
    ``given: dict`` of what was given, parsed (the keyword arguments of RuntimeSchedules.add/change)."""

    @functools.wraps(func)
    def command(*args: Any, **kwargs: Any) -> Any:
        given: dict[str, Any] = {}
        for name in ("cron", "timezone", "task"):
            if kwargs[name] is not None:
                given[name] = kwargs[name]
        if kwargs["every"] is not None:
            given["every"] = _every(kwargs["every"])
        for name in ("start", "end"):
            if kwargs[name] is not None:
                given[name] = None if kwargs[name].lower() == "none" else _instant(f"--{name}", kwargs[name])
        for name in ("args", "kwargs", "options"):
            if kwargs[name] is not None:
                given[name] = _json_option(f"--{name}")(kwargs[name])
        for option in _SCHEDULE_OPTION_NAMES:
            del kwargs[option]
        return func(*args, given=given, **kwargs)

    for option in reversed(_SCHEDULE_OPTIONS):
        command = option(command)
    return cast(F, command)


_SCHEDULE_OPTION_NAMES = ("cron", "every", "timezone", "start", "end", "task", "args", "kwargs", "options")


def print_definition(session: Session, verb: str, definition: ScheduleDefinition) -> None:
    timing = "its code's timing" if definition.timing is None else definition.timing.describe()
    paused = " (paused)" if definition.paused else ""
    report(
        session,
        {"name": definition.name, verb: True, **definition_fields(definition.name, definition.encode())},
        f"Schedule {printable(definition.name)!r} {verb}: {timing}{paused}.",
    )


@cron.command("add", short_help="Store a new recurring schedule (runs in every promoter of the namespace).")
@click.argument("name")
@schedule_options
@click.option("--paused", is_flag=True, help="Store it paused (resume it later).")
@store_options
@reports_errors
def cron_add(
    name: str, given: dict[str, Any], paused: bool, redis_url: str | None, namespace: str, as_json: bool
) -> None:
    """Store schedule NAME: send --task with --args/--kwargs at every occurrence of --cron or --every. Promoters
    pick it up within seconds; an unknown task or actor is reported in the promoters' logs at each occurrence."""
    if "task" not in given:
        raise click.UsageError("give --task: the Celery task name or Dramatiq actor name to send")
    session = open_session(redis_url, namespace, as_json)
    task = given.pop("task")
    given["args"] = given.get("args") or []
    definition = RuntimeSchedules(session.store).add(name, task, paused=paused, **given)
    print_definition(session, "added", definition)


@cron.command("change", short_help="Change a schedule's timing or message (also one declared in code).")
@click.argument("name")
@schedule_options
@store_options
@reports_errors
def cron_change(name: str, given: dict[str, Any], redis_url: str | None, namespace: str, as_json: bool) -> None:
    """Change what is given and keep the rest. Its parked occurrence under the old definition is cancelled
    and the first one after now under the new one is parked. On a schedule declared in code, a new timing
    overrides the code's until 'cron remove NAME'."""
    if not given:
        raise click.UsageError("nothing to change: give --cron, --every, --task, --args ...")
    session = open_session(redis_url, namespace, as_json)
    print_definition(session, "changed", RuntimeSchedules(session.store).change(name, **given))


def _simple(verb: str, action: str, help_text: str) -> None:
    @cron.command(verb, short_help=help_text)
    @click.argument("name")
    @store_options
    @reports_errors
    def command(name: str, redis_url: str | None, namespace: str, as_json: bool) -> None:
        session = open_session(redis_url, namespace, as_json)
        print_definition(session, action, getattr(RuntimeSchedules(session.store), verb)(name))

    command.__doc__ = help_text


_simple("pause", "paused", "Stop a schedule's occurrences (its parked one is cancelled); run-now still works.")
_simple("resume", "resumed", "Restart a paused schedule from its first occurrence after now.")


@cron.command("run-now", short_help="Send a schedule's message once, now, besides its occurrences.")
@click.argument("name")
@store_options
@reports_errors
def cron_run_now(name: str, redis_url: str | None, namespace: str, as_json: bool) -> None:
    """Send schedule NAME's message once, now: a promoter parks it (once) within a second or so."""
    session = open_session(redis_url, namespace, as_json)
    id = RuntimeSchedules(session.store).run_now(name)
    report(session, {"name": name, "id": id}, f"Asked for a run of {printable(name)!r} now: message id {id}.")


@cron.command("remove", short_help="Delete a stored schedule and cancel its parked occurrence (asks first).")
@click.argument("name")
@confirm_option
@store_options
@reports_errors
def cron_remove(name: str, yes: bool, redis_url: str | None, namespace: str, as_json: bool) -> None:
    """Delete the stored definition of NAME, its record and its parked occurrence. A schedule declared in code
    goes back to its code's timing."""
    session = open_session(redis_url, namespace, as_json)
    schedules = RuntimeSchedules(session.store)
    # Whether one is stored, not whether it can be read: removing is how an unreadable one is got rid of.
    if name not in session.store.stored_schedules().definitions:
        raise click.ClickException(f"no stored schedule {printable(name)!r} in namespace {namespace!r}")
    confirm(f"remove schedule {printable(name)!r}", f"Remove schedule {printable(name)!r}?", yes)
    schedules.remove(name)
    report(session, {"name": name, "removed": True}, f"Removed schedule {printable(name)!r}.")


@cron.command("forget", short_help="Drop a schedule's record and cancel its parked occurrence (asks first).")
@click.argument("name")
@confirm_option
@store_options
@reports_errors
def cron_forget(name: str, yes: bool, redis_url: str | None, namespace: str, as_json: bool) -> None:
    """Drop the record of schedule NAME and cancel its parked occurrence: for a schedule removed from the
    application. A promoter that still declares it parks its next occurrence again."""
    session = open_session(redis_url, namespace, as_json)
    recorded = session.store.schedules()  # a record rewound by a change shows no occurrence, yet is one
    row = next((row for row in schedule_rows(session.store) if row["name"] == name), None)
    if row is None or name not in recorded:
        raise click.ClickException(f"no schedule {printable(name)!r} in namespace {namespace!r}")
    what = f"schedule {printable(name)!r}"
    confirm(f"forget {what}", f"Forget {what} and cancel its next run?", yes)
    cancelled = row["id"] is not None and session.store.cancel(row["id"])
    session.store.forget_schedule(name)
    note = f"; cancelled its occurrence {row['id']}" if cancelled else ""
    report(
        session,
        {"name": name, "forgotten": True, "cancelled": cancelled},
        f"Forgot schedule {printable(name)!r}{note}.",
    )


COMMANDS = [cron]
"""This module's commands, in the order ``delay-broker --help`` lists them."""
