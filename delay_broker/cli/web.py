"""``delay-broker web``: the operations dashboard on a local port."""

from __future__ import annotations

import click

from .common import open_session, reports_errors, store_options


@click.command(short_help="Serve the operations dashboard (on 127.0.0.1 by default).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (0.0.0.0: every interface).")
@click.option("--port", "-p", type=click.IntRange(0, 65535), default=8471, show_default=True, help="Port to serve on.")
@click.option("--read-only", is_flag=True, help="Show everything, change nothing (every write is refused).")
@store_options
@reports_errors
def web(host: str, port: int, read_only: bool, redis_url: str | None, namespace: str, as_json: bool) -> None:
    """Serve the dashboard of one namespace: overview, message lists with filters and bulk actions, message
    pages, dead letters and recurring schedules. Needs the 'web' extra: pip install 'delay-broker[web]'.

    Binds 127.0.0.1 unless told otherwise: the dashboard has no login of its own. Put it behind your
    authentication (or mount delay_broker.web.create_app in your own app) before exposing it.
    """
    try:
        import uvicorn

        from ..web import create_app
    except ImportError:
        raise click.ClickException("the dashboard needs the 'web' extra: pip install 'delay-broker[web]'") from None
    session = open_session(redis_url, namespace, as_json)
    app = create_app(session.store, read_only=read_only)
    click.echo(
        f"delay_broker dashboard for namespace {namespace!r}: http://{host}:{port}/"
        + (" (read-only)" if read_only else "")
    )
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning")
    except SystemExit as exit:
        # uvicorn exits with its own code (3 when the port is taken) after logging why; the CLI's is 1.
        if exit.code not in (0, None):
            raise click.ClickException(f"the dashboard could not serve on {host}:{port} (see above)") from None


COMMANDS = [web]
"""This module's commands, in the order ``delay-broker --help`` lists them."""
