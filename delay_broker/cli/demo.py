"""``delay-broker demo``: see it work on a private redis-server."""

from __future__ import annotations

import sys

import click
import redis
from rich.console import Console
from rich.table import Table

# -- demo ------------------------------------------------------------------------------------------------------------


@click.command(short_help="See it work: a Dramatiq app with and without delay_broker on a private Redis.")
@click.option("--redis-url", envvar="DELAY_BROKER_REDIS_URL", help="Use this Redis instead of a private one.")
@click.option(
    "--messages", default=3000, show_default=True, type=click.IntRange(min=1), help="How many delayed messages to send."
)
@click.option("--seconds", default=4.0, show_default=True, type=click.FloatRange(min=0), help="How long sending takes.")
@click.option(
    "--max-delay",
    default=8.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Longest delay in seconds (shortest: 2 s).",
)
@click.option("--lists", is_flag=True, help="Framework-free variant: park and promote into plain Redis lists.")
def demo(redis_url: str | None, messages: int, seconds: float, max_delay: float, lists: bool) -> None:
    """Send delayed messages to a Dramatiq worker with delay_broker and to a plain Dramatiq worker, side by
    side, and compare: executed, duplicates, lost, lateness, and the workers' memory.

    Without --redis-url it starts a private redis-server on a free port in a temporary directory. The delays
    are above the demo's 1 s threshold, so delay_broker parks every message in Redis while plain Dramatiq
    holds them in the worker until they are due.
    """
    from ..embedded import EmbeddedRedis

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

    from ..demo.dramatiq_run import run_dramatiq_demo

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
    from ..demo.lists import run_list_demo

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


COMMANDS = [demo]
"""This module's commands, in the order ``delay-broker --help`` lists them."""
