"""What every command shares: the store options (--redis-url, --namespace, --json), sessions, confirmation,
error reporting and safe table cells."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

import click
import redis
from rich.console import Console
from rich.text import Text

from ..errors import DelayBrokerError
from ..keys import DEFAULT_NAMESPACE
from ..store import DelayStore, MessageInfo
from .format import printable

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
