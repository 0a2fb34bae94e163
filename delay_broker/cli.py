"""The ``delay-broker`` command."""

from __future__ import annotations

import sys
from typing import Any

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
    @click.option("--redis-url", envvar="DELAY_BROKER_REDIS_URL", help="Use this Redis instead of a private one.")
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


if click is not None:

    @cli.command()
    @click.option("--dramatiq", "dramatiq_broker", metavar="MODULE:BROKER", help="Promote for this Dramatiq broker.")
    @click.option("--celery", "celery_app", metavar="MODULE:APP", help="Promote for this Celery app.")
    @click.option("--batch", type=click.IntRange(1, 1000), default=None, help="Messages per claim (1-1000).")
    @click.option("--lease", type=click.FloatRange(min=1), default=None, help="Seconds a claimed message is held.")
    @click.option("--max-idle", type=click.FloatRange(min=0.1), default=None, help="Longest sleep in seconds.")
    def promote(
        dramatiq_broker: str | None,
        celery_app: str | None,
        batch: int | None,
        lease: float | None,
        max_idle: float | None,
    ) -> None:
        """Run a standalone promoter until interrupted (Ctrl-C / SIGTERM stop it gracefully).

        Give the application to promote for, as an importable MODULE:NAME; the promoter uses that app's own
        delay_broker settings (Redis, namespace) and delivers into its queues.
        """
        if (dramatiq_broker is None) == (celery_app is None):
            raise click.UsageError("give exactly one of --dramatiq MODULE:BROKER and --celery MODULE:APP")
        overrides = {
            name: value
            for name, value in (("batch", batch), ("lease", lease), ("max_idle", max_idle))
            if value is not None
        }
        if dramatiq_broker is not None:
            from . import dramatiq as adapter

            promoter = adapter.build_promoter(import_object(dramatiq_broker), **overrides)
        else:
            from . import celery as celery_adapter

            promoter = celery_adapter.build_promoter(import_object(celery_app or ""), **overrides)
        run_until_signalled(promoter)


def import_object(path: str) -> Any:
    """Import ``package.module:attribute`` (or ``package.module.attribute``)."""
    import importlib

    module_name, _, attribute = path.partition(":") if ":" in path else path.rpartition(".")
    if not module_name or not attribute:
        raise SystemExit(f"delay-broker: expected MODULE:NAME, got {path!r}")
    sys.path.insert(0, ".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise SystemExit(f"delay-broker: cannot import {module_name!r}: {error}") from None
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise SystemExit(f"delay-broker: {module_name!r} has no attribute {attribute!r}") from None


def run_until_signalled(promoter: Any) -> None:
    """Run a promoter in this thread; SIGINT and SIGTERM stop it after the batch in hand."""
    import logging
    import signal

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    def stop(signum: int, frame: Any) -> None:
        promoter.request_stop()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    promoter.run()
