"""What every command shares: the store options (--redis-url, --namespace, --json), sessions, confirmation,
error reporting and safe table cells."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

import click
import redis
from rich.console import Console
from rich.text import Text

from ..connect import redacted
from ..errors import DelayBrokerError, FarTierUnavailable, StoreUnavailable
from ..keys import DEFAULT_NAMESPACE, DEFAULT_PREFIX
from ..operations import BulkResult, MessageFilter, Operations
from ..store import DelayStore, MessageInfo
from .format import describe_filter, parse_when, printable

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


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Keep a store option (far tier, key prefix) for :func:`open_session`, so commands need no parameter."""
    if value not in (None, ""):  # an empty variable is no tier
        ctx.meta[f"delay_broker.{param.name}"] = value
    return value


def prefix_option(func: F) -> F:
    """``--prefix``: the store's key prefix, for an application that sets ``prefix`` (kept for open_session)."""
    return click.option(
        "--prefix",
        envvar="DELAY_BROKER_PREFIX",
        show_envvar=True,
        metavar="PREFIX",
        expose_value=False,
        callback=_remember,
        help=f"Key prefix your application's delay_broker settings use (prefix=...)  [default: {DEFAULT_PREFIX}]",
    )(func)


def far_tier_options(func: F) -> F:
    """``--far-tier`` and ``--far-horizon``: the application's far tier, if it has one (kept for open_session)."""
    func = click.option(
        "--far-horizon",
        envvar="DELAY_BROKER_FAR_HORIZON",
        show_envvar=True,
        type=click.FloatRange(min=0, min_open=True),
        metavar="SECONDS",
        expose_value=False,
        callback=_remember,
        help="The far tier's horizon, as your application sets it (default 6 hours): a message rescheduled to "
        "within it is moved into Redis at once.",
    )(func)
    func = click.option(
        "--far-tier",
        envvar="DELAY_BROKER_FAR_TIER",
        show_envvar=True,
        metavar="URL",
        expose_value=False,
        callback=_remember,
        help="The PostgreSQL of your application's far tier, if it has one (postgresql://...): its messages are "
        "then listed, counted, shown, cancelled and rescheduled with those in Redis.",
    )(func)
    return func


def _pack_after(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value in (None, ""):
        return
    assert value is not None
    if value.lower() == "none":
        ctx.meta["delay_broker.pack_after"] = None
        return
    try:
        seconds = float(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is neither a number of seconds nor 'none'") from None
    if not seconds >= 10 or seconds == float("inf"):
        raise click.BadParameter(f"{value!r}: at least 10 seconds, or 'none'")
    ctx.meta["delay_broker.pack_after"] = seconds


def pack_after_option(func: F) -> F:
    """``--pack-after``: the application's ``pack_after``, for what the command parks (a reschedule, a schedule's
    occurrence, the dashboard's actions)."""
    return click.option(
        "--pack-after",
        envvar="DELAY_BROKER_PACK_AFTER",
        show_envvar=True,
        metavar="SECONDS|none",
        expose_value=False,
        callback=_pack_after,
        help="Pack what this command parks as your application does (pack_after=...; 'none' packs nothing, as "
        "for a rolling upgrade from a release without packs)  [default: 300]",
    )(func)


def store_options(func: F) -> F:
    """``--redis-url``, ``--namespace``, ``--prefix``, ``--far-tier``, ``--far-horizon``, ``--pack-after`` and
    ``--json``, shared by every command that reads the store."""
    func = click.option("--json", "as_json", is_flag=True, help="Print JSON (for scripts) instead of tables.")(func)
    func = pack_after_option(func)
    func = prefix_option(func)
    func = far_tier_options(func)
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
    meta = click.get_current_context().meta
    far = {"far_tier": meta.get("delay_broker.far_tier"), "far_horizon": meta.get("delay_broker.far_horizon")}
    prefix = meta.get("delay_broker.prefix", DEFAULT_PREFIX)
    packing = {"pack_after": meta["delay_broker.pack_after"]} if "delay_broker.pack_after" in meta else {}
    try:
        store = DelayStore.from_url(
            redis_url,
            namespace=namespace,
            prefix=prefix,
            socket_connect_timeout=5.0,
            socket_timeout=15.0,
            **far,
            **packing,
        )
    except ValueError as error:
        raise click.UsageError(f"cannot use --redis-url / --namespace / --prefix / --far-tier: {error}") from None
    return Session(store, namespace, as_json)


def reports_errors(func: F) -> F:
    """Refuse text arguments that are not UTF-8 before doing anything, and turn store and Redis errors into a
    one-line message and exit status 1 (no traceback)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        check_text(click.get_current_context(silent=True))
        try:
            return func(*args, **kwargs)
        except (StoreUnavailable, redis.ConnectionError, redis.TimeoutError) as error:
            raise click.ClickException(unreachable(error, click.get_current_context(silent=True))) from None
        except (DelayBrokerError, redis.RedisError) as error:
            raise click.ClickException(str(error) or type(error).__name__) from None
        except UnicodeEncodeError as error:
            # Text that reached Redis (or PostgreSQL) by a way check_text does not see: still one line.
            raise click.ClickException(f"text that is not valid UTF-8 cannot be stored or looked up: {error}") from None

    return cast(F, wrapper)


# What each command was doing, in the user's words, for the message of a Redis (or PostgreSQL) it cannot reach.
DOING = {
    "stats": "reading the store's counts",
    "ls": "listing messages",
    "show": "reading the message",
    "cancel": "cancelling",
    "reschedule": "rescheduling",
    "dead ls": "listing dead-lettered messages",
    "dead show": "reading the dead-lettered message",
    "dead requeue": "requeueing dead-lettered messages",
    "dead purge": "purging dead-lettered messages",
    "cron ls": "listing recurring schedules",
    "web": "starting the dashboard",
    "promote": "promoting",
    "import": "importing",
    "metrics": "reading the store for metrics",
}
_UNAVAILABLE = re.compile(r"^(?:Redis (?:Cluster )?unavailable during [^:]*: |far tier: )")


def unreachable(error: BaseException, ctx: click.Context | None) -> str:
    """One line for a Redis (or far tier) that did not answer: which URL (password masked), while doing what,
    why, and which option to check. The store's own message says what it was doing in its terms (reading the
    shard layout ...), which means nothing to the person at the terminal."""
    command = " ".join((ctx.command_path if ctx else "").split()[1:])
    doing = DOING.get(command) or (
        "changing recurring schedules" if command.startswith("cron") else "reading the store"
    )
    detail = _UNAVAILABLE.sub("", str(error)) or type(error).__name__
    params = ctx.params if ctx else {}
    detail = detail.strip().rstrip(".")
    if isinstance(error, FarTierUnavailable):
        url = (ctx.meta.get("delay_broker.far_tier") if ctx else None) or ""
        where = f"the far tier's PostgreSQL at {redacted(url)}" if url else "the far tier's PostgreSQL"
        return f"cannot reach {where} while {doing}: {detail}. Check --far-tier (or DELAY_BROKER_FAR_TIER)."
    url = params.get("redis_url")
    if url:
        check = "Check --redis-url (or DELAY_BROKER_REDIS_URL)."
        return f"cannot reach Redis at {redacted(url)} while {doing}: {detail}. {check}"
    # promote: the application's own settings name the store.
    return f"cannot reach the store's Redis while {doing}: {detail}. Check your application's delay_broker settings."


def check_text(ctx: click.Context | None) -> None:
    """A usage error naming the argument or option whose text cannot be encoded as UTF-8: bytes that are not
    UTF-8 on the command line (Python keeps them as surrogates) can be no id, queue or prefix Redis holds, and
    refusing them here, before the first command, leaves nothing half done."""
    if ctx is None:
        return
    for param in ctx.command.params:
        if not isinstance(param.type, click.types.StringParamType):
            continue  # paths and choices are not sent to the store
        value = ctx.params.get(param.name or "")
        for text in value if isinstance(value, list | tuple) else (value,):
            if isinstance(text, str) and not _is_utf8(text):
                raise click.BadParameter(
                    f"{text!r} is not valid UTF-8 (ids, names and prefixes in the store are UTF-8 text)",
                    ctx=ctx,
                    param=param,
                )


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def emit_json(data: Any) -> None:
    """``data`` as strict JSON: a payload's NaN or Infinity (which Python's JSON reads) is given as a string,
    not as the bare word strict parsers refuse."""
    try:
        text = json.dumps(data, indent=2, sort_keys=False, ensure_ascii=True, default=str, allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(data), indent=2, sort_keys=False, ensure_ascii=True, default=str)
    click.echo(text)


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float as its text (NaN, Infinity, -Infinity), without recursion."""
    root: list[Any] = [value]
    pending: list[tuple[Any, Any]] = [(root, 0)]
    while pending:
        container, key = pending.pop()
        item = container[key]
        if isinstance(item, float) and not math.isfinite(item):
            container[key] = "NaN" if math.isnan(item) else "Infinity" if item > 0 else "-Infinity"
        elif isinstance(item, dict):
            copy = dict(item)
            container[key] = copy
            pending.extend((copy, name) for name in copy)
        elif isinstance(item, list | tuple):
            copy_list = list(item)
            container[key] = copy_list
            pending.extend((copy_list, index) for index in range(len(copy_list)))
    return root[0]


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


# -- filters (the operations layer's MessageFilter) ----------------------------------------------------------------


@dataclass(frozen=True)
class FilterArgs:
    """What ``--queue``, ``--task``, ``--id-prefix``, ``--text``, ``--from`` and ``--to`` said."""

    queue: str | None = None
    task: str | None = None
    id_prefix: str | None = None
    text: str | None = None
    start: str | None = None
    end: str | None = None

    @property
    def given(self) -> bool:
        return any(dataclasses.astuple(self))

    @property
    def windowed(self) -> bool:
        return self.start is not None or self.end is not None

    def to_filter(self, session: Session, state: ListState) -> MessageFilter:
        """The operations layer's filter (times read by the Redis clock); a usage error when malformed."""
        now = session.store.now_ms()
        try:
            start_ms = None if self.start is None else parse_when(self.start, now)
            end_ms = None if self.end is None else parse_when(self.end, now)
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint="--from/--to") from None
        if start_ms is not None and end_ms is not None and start_ms > end_ms:
            raise click.BadParameter("--from is after --to", param_hint="--from/--to")
        return MessageFilter(
            state, start_ms, end_ms, self.queue or None, self.task or None, self.id_prefix or None, self.text or None
        )


_FILTER_OPTIONS = (
    click.option("--queue", metavar="QUEUE", help="Only messages for this queue (their route)."),
    click.option("--task", metavar="NAME", help="Only messages of this actor (Dramatiq) or task (Celery)."),
    click.option("--id-prefix", metavar="PREFIX", help="Only messages whose id starts with PREFIX."),
    click.option("--text", metavar="TEXT", help="Only messages whose decoded payload contains TEXT."),
    click.option(
        "--from",
        "start",
        metavar="WHEN",
        help="Earliest time: ISO 8601 (UTC unless it has an offset), 'now', or relative: 5m, -2h, 3d.",
    ),
    click.option(
        "--to",
        "end",
        metavar="WHEN",
        help="Latest time: ISO 8601 (UTC unless it has an offset), 'now', or relative: 30m, -1h, 2d.",
    ),
)


def filter_options(func: F) -> F:
    """The filter options, handed to the command as one ``filters: FilterArgs`` argument. ``--from``/``--to``
    bound the time a state is ordered by (due time, lease deadline, time of death)."""
    names = [field.name for field in dataclasses.fields(FilterArgs)]

    @functools.wraps(func)
    def command(*args: Any, **kwargs: Any) -> Any:
        kwargs["filters"] = FilterArgs(**{name: kwargs.pop(name) for name in names})
        return func(*args, **kwargs)

    for option in reversed(_FILTER_OPTIONS):
        command = option(command)
    return cast(F, command)


def act_on_filter(
    session: Session,
    ids: Sequence[str] | None,
    filters: FilterArgs,
    state: ListState,
    yes: bool,
    verb: str,
    act: Callable[[Operations, Mapping[str, str]], BulkResult],
) -> bool:
    """When a filter was given (never with IDs): find what it selects, ask (``verb`` N messages ...?), act on
    exactly those in batches, report what was done, and return True. False when no filter was given."""
    if not filters.given:
        return False
    if ids:
        raise click.UsageError("give IDs or a filter (--queue, --task, ...), not both")
    filter = filters.to_filter(session, state)
    ops = Operations(session.store)
    # The ids counted are the ids acted on: a message parked while the question waits is not one the operator
    # said yes to.
    targets = ops.select(filter)
    what = f"{len(targets):,} {STATE_WORDS[filter.state]} message(s) matching {describe_filter(filter)}"
    if not targets:
        report(
            session,
            {"action": verb, "matched": 0, "done": 0, "skipped": [], "failed": {}},
            f"No {STATE_WORDS[filter.state]} message matches {describe_filter(filter)}.",
        )
        return True
    confirm(f"{verb} {what}", f"{verb.capitalize()} {what}?", yes)
    result = act(ops, targets)
    text = f"{verb.capitalize()}: {result.done:,} of {result.matched:,} matching message(s)."
    gone = result.matched - result.done - len(result.failed)
    if gone:
        text += f" {gone:,} were no longer there (promoted or changed meanwhile)."
    data = {
        "action": verb,
        "matched": result.matched,
        "done": result.done,
        "skipped": result.skipped,
        "failed": result.failed,
    }
    report(session, data, text)
    if result.failed:
        # Still there and not acted on: an error, unlike a message gone meanwhile. Each with why, on stderr.
        click.echo(f"Not done for {len(result.failed):,} message(s) that could not be rewritten:", err=True)
        for id, reason in list(result.failed.items())[:20]:
            click.echo(f"  {printable(id)!r}: {printable(reason)}", err=True)
        if len(result.failed) > 20:
            click.echo(f"  ... and {len(result.failed) - 20:,} more (--json lists them all)", err=True)
        sys.exit(1)
    return True
