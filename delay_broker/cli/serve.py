"""``promote`` and ``metrics``: the long-running commands."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

from ..errors import DelayBrokerError
from ..keys import DEFAULT_NAMESPACE
from ..running import configure_logging, import_object, run_until_signalled, wait_for_signal
from .common import LOG_LEVELS, far_tier_options, open_session, prefix_option, reports_errors

# -- promote / metrics --------------------------------------------------------------------------------------------


def build_app_promoter(dramatiq_broker: str | None, celery_app: str | None, overrides: dict[str, Any]) -> Any:
    """The application's promoter, built by its adapter from ``MODULE:NAME``."""
    if dramatiq_broker is not None:
        import dramatiq

        from .. import dramatiq as adapter

        broker = app_object("--dramatiq", dramatiq_broker)
        if not isinstance(broker, dramatiq.Broker):
            raise click.UsageError(f"--dramatiq {dramatiq_broker} is a {type(broker).__name__}, not a Dramatiq broker")
        return adapter.build_promoter(broker, **overrides)
    import celery

    from .. import celery as celery_adapter

    app = app_object("--celery", celery_app or "")
    if not isinstance(app, celery.Celery):
        raise click.UsageError(f"--celery {celery_app} is a {type(app).__name__}, not a Celery app")
    return celery_adapter.build_promoter(app, **overrides)


def app_object(option: str, path: str) -> Any:
    """What ``option`` names (``MODULE:NAME``); a usage error (exit status 2) when it is not there."""
    try:
        return import_object(path)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint=f"'{option}'") from None


@click.command(short_help="Run a standalone promoter for a Dramatiq broker or a Celery app.")
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
@reports_errors
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
    configure_logging(log_level)
    overrides = {
        name: value for name, value in (("batch", batch), ("lease", lease), ("max_idle", max_idle)) if value is not None
    }
    promoter = build_app_promoter(dramatiq_broker, celery_app, overrides)
    server = None
    if metrics_port is not None:
        from ..metrics import ListenerChain, PromoterMetrics, start_metrics_server

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


@click.command("metrics", short_help="Serve the store's Prometheus metrics (backlog, overdue, dead) over HTTP.")
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
@prefix_option
@far_tier_options
@reports_errors
def metrics_command(port: int, addr: str, print_once: bool, namespaces: Sequence[str], redis_url: str | None) -> None:
    """Serve Prometheus metrics read from the store at each scrape (parked, in flight, dead, overdue,
    oldest-overdue age, live promoters, counters), until interrupted. Useful where no promoter exposes
    metrics, e.g. when promoters run inside Dramatiq or Celery workers. With --far-tier, parked messages in
    PostgreSQL are counted with those in Redis.

    \b
    Examples:
      delay-broker metrics --redis-url redis://localhost:6379/0 --port 9871
      delay-broker metrics -n billing -n mail --print
      delay-broker metrics --far-tier postgresql://delay@db/app --port 9871
    """
    from ..metrics import StoreCollector, prometheus, start_metrics_server

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
    configure_logging("INFO")
    try:
        server = start_metrics_server(port, stores, addr=addr)
    except OSError as error:
        raise click.ClickException(f"cannot serve metrics on {addr}:{port}: {error}") from None
    click.echo(f"Serving metrics of namespace(s) {', '.join(chosen)} on {server.url} (Ctrl-C stops).", err=True)
    wait_for_signal()
    server.stop()


COMMANDS = [promote, metrics_command]
"""This module's commands, in the order ``delay-broker --help`` lists them."""
