"""The ``delay-broker`` command."""

from __future__ import annotations

import sys

try:
    import click
    from rich.console import Console
    from rich.table import Table
except ImportError:  # pragma: no cover - depends on the install
    click = None  # type: ignore[assignment]


def main() -> None:
    if click is None:
        sys.exit("delay-broker: the command needs the 'cli' extra: pip install 'delay-broker[cli]'")
    cli()


if click is not None:

    @click.group(context_settings={"help_option_names": ["-h", "--help"]})
    def cli() -> None:
        """Park long-delayed Dramatiq and Celery messages in Redis and promote them when due."""

    @cli.command()
    @click.option(
        "--redis-url", envvar="DELAY_BROKER_REDIS_URL", help="Use this Redis instead of a private one."
    )
    @click.option("--messages", default=3000, show_default=True, help="How many messages to park.")
    @click.option("--seconds", default=3.0, show_default=True, help="Spread of due times from now.")
    @click.option("--promoters", default=2, show_default=True, help="Promoter threads running at once.")
    def demo(redis_url: str | None, messages: int, seconds: float, promoters: int) -> None:
        """Park messages, promote them when due, and count duplicates, losses and lateness.

        Without --redis-url it starts a private redis-server on a free port in a temporary directory.
        """
        from .demo import run_list_demo
        from .embedded import EmbeddedRedis

        console = Console()
        server = None if redis_url else EmbeddedRedis().start()
        try:
            import redis

            client = redis.Redis.from_url(redis_url) if redis_url else server.client()  # type: ignore[union-attr]
            where = redis_url or f"private redis-server on port {server.port}"  # type: ignore[union-attr]
            console.print(f"Parking {messages} messages due over {seconds:.0f} s on {where} ...")
            report = run_list_demo(client, messages=messages, spread=seconds, promoters=promoters)
        finally:
            if server is not None:
                server.close()
        table = Table(title="delay-broker demo")
        table.add_column("measure")
        table.add_column("value", justify="right")
        for name, value in report.rows():
            table.add_row(name, value)
        console.print(table)
        if report.duplicates or report.lost:
            sys.exit(1)
