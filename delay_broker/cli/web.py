"""``delay-broker web``: the operations dashboard on a local port, or behind authentication on a network one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import click

from ..connect import _redacted
from ..errors import ConfigurationError, DelayBrokerError
from ..store import DelayStore
from .common import F, open_session, reports_errors, store_options

NO_AUTH_ON_NETWORK = (
    "refusing to serve the dashboard on {host} without authentication: anyone who can reach that address could "
    "read every message and cancel, run or purge them. Set DELAY_BROKER_WEB_PASSWORD (or --password-file) for "
    "HTTP basic auth, or DELAY_BROKER_WEB_TOKEN (or --token-file) for a bearer token; or serve on 127.0.0.1 "
    "behind a proxy that authenticates. --allow-unauthenticated serves it anyway."
)


SECURITY_OPTIONS = [
    click.option(
        "--user",
        envvar="DELAY_BROKER_WEB_USER",
        show_envvar=True,
        default="admin",
        show_default=True,
        help="User name for HTTP basic auth (its password: DELAY_BROKER_WEB_PASSWORD or --password-file).",
    ),
    click.option(
        "--password-file",
        envvar="DELAY_BROKER_WEB_PASSWORD_FILE",
        show_envvar=True,
        type=click.Path(dir_okay=False),
        help="File whose first line is the basic-auth password (or set DELAY_BROKER_WEB_PASSWORD).",
    ),
    click.option(
        "--token-file",
        envvar="DELAY_BROKER_WEB_TOKEN_FILE",
        show_envvar=True,
        type=click.Path(dir_okay=False),
        help="File whose first line is a bearer token to accept (or set DELAY_BROKER_WEB_TOKEN).",
    ),
    click.option(
        "--secret-file",
        envvar="DELAY_BROKER_WEB_SECRET_FILE",
        show_envvar=True,
        type=click.Path(dir_okay=False),
        help="File whose first line signs sessions and form tokens (or set DELAY_BROKER_WEB_SECRET; default: "
        "one generated per process).",
    ),
    click.option(
        "--allowed-host",
        "allowed_hosts",
        multiple=True,
        envvar="DELAY_BROKER_WEB_ALLOWED_HOSTS",
        show_envvar=True,
        metavar="NAME[:PORT]",
        help="Also answer to this Host (repeat for several; the bound address and port always work).",
    ),
    click.option(
        "--trusted-origin",
        "trusted_origins",
        multiple=True,
        envvar="DELAY_BROKER_WEB_TRUSTED_ORIGINS",
        show_envvar=True,
        metavar="URL",
        help="Accept forms from this origin (https://name[:port]) too: behind a proxy that rewrites Host.",
    ),
    click.option(
        "--allow-unauthenticated",
        is_flag=True,
        help="Serve a non-loopback address without authentication (anyone who can reach it can act).",
    ),
]
"""Authentication, the Host allow-list, trusted origins, the form secret and the opt-out flag. Secrets come from
the environment or files only: a command line is visible to every user of the machine."""


def security_options(func: F) -> F:
    """The :data:`SECURITY_OPTIONS`, in their order in ``--help``."""
    for option in reversed(SECURITY_OPTIONS):
        func = option(func)
    return func


@dataclass
class Security:
    """What the security options come to, checked before anything is started."""

    credentials: Any  # delay_broker.web.auth.Credentials (imported with the 'web' extra)
    secret: Any  # delay_broker.web.secret.Secret
    allowed_hosts: tuple[str, ...]
    trusted_origins: tuple[str, ...]


def check_security(host: str, options: dict[str, Any]) -> Security:
    """The options read and checked; a usage error (exit 2) for anything wrong, or for a network address
    without authentication and without --allow-unauthenticated."""
    from ..web.auth import load_credentials
    from ..web.secret import read_secret_file, resolve_secret
    from ..web.security import AllowedHosts, trusted_origins
    from ..web.server import is_loopback

    try:
        credentials = load_credentials(options["user"], options["password_file"], options["token_file"])
        secret_file = options["secret_file"]
        secret = read_secret_file(secret_file) if secret_file else resolve_secret(None, warn=False)
        AllowedHosts(options["allowed_hosts"])  # checked now, used once the port is known
        trusted_origins(options["trusted_origins"])
    except ConfigurationError as error:
        raise click.UsageError(str(error)) from None
    if not credentials.required and not options["allow_unauthenticated"] and not is_loopback(host):
        raise click.UsageError(NO_AUTH_ON_NETWORK.format(host=host))
    return Security(credentials, secret, tuple(options["allowed_hosts"]), tuple(options["trusted_origins"]))


@click.command(short_help="Serve the operations dashboard (on 127.0.0.1 by default).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (0.0.0.0: every interface).")
@click.option("--port", "-p", type=click.IntRange(0, 65535), default=8471, show_default=True, help="Port to serve on.")
@click.option("--read-only", is_flag=True, help="Show everything, change nothing (every write is refused).")
@security_options
@store_options
@reports_errors
def web(
    host: str, port: int, read_only: bool, redis_url: str | None, namespace: str, as_json: bool, **options: Any
) -> None:
    """Serve the dashboard of one namespace: overview, message lists with filters and bulk actions, message
    pages, dead letters and recurring schedules. Needs the 'web' extra: pip install 'delay-broker[web]'.

    Binds 127.0.0.1 unless told otherwise. Any other address needs authentication: HTTP basic auth
    (DELAY_BROKER_WEB_PASSWORD or --password-file) and/or a bearer token (DELAY_BROKER_WEB_TOKEN or
    --token-file), or --allow-unauthenticated. Forms are accepted from the dashboard's own pages only, and the
    server answers only to its own address (--allowed-host adds names). See docs/exposing-the-dashboard.md.

    \b
    Examples:
      delay-broker web -r redis://localhost:6379/0
      DELAY_BROKER_WEB_PASSWORD_FILE=/run/secrets/dash delay-broker web --host 0.0.0.0 --allowed-host dash.lan
    """
    try:
        import uvicorn

        from ..web import server
        from ..web.security import AllowedHosts
    except ImportError:
        raise click.ClickException("the dashboard needs the 'web' extra: pip install 'delay-broker[web]'") from None
    security = check_security(host, options)
    session = open_session(redis_url, namespace, as_json)
    check_redis(session.store, redis_url or "")
    try:
        listener = server.bind(host, port)
    except OSError as error:
        raise click.ClickException(f"the dashboard could not serve on {host}:{port}: {error}") from None
    try:
        port = listener.getsockname()[1]
        allowed = AllowedHosts([*server.default_hosts(host, port), *security.allowed_hosts])
        app = server.standalone_app(
            session.store,
            read_only=read_only,
            secret=security.secret,
            credentials=security.credentials,
            allowed_hosts=allowed,
            trusted_origins=security.trusted_origins,
        )
        # Only now, with Redis answering and the port bound, is there a URL to give.
        url = f"http://{server.display_host(host)}:{port}/"
        click.echo(f"delay_broker dashboard for namespace {namespace!r}: {url}" + (" (read-only)" if read_only else ""))
        describe(host, allowed, security)
        uvicorn_server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
        uvicorn_server.run(sockets=[listener])
    except SystemExit as exit:
        # uvicorn exits with its own code after logging why; the CLI's is 1.
        if exit.code not in (0, None):
            raise click.ClickException(f"the dashboard could not serve on {host}:{port} (see above)") from None
    finally:
        listener.close()


def check_redis(store: DelayStore, redis_url: str) -> None:
    """Fail now, before binding or printing anything, when the store's Redis does not answer."""
    try:
        store.now_ms()
    except DelayBrokerError as error:
        raise click.ClickException(f"cannot reach Redis at {_redacted(redis_url)}: {error}") from None


def describe(host: str, allowed: Any, security: Security) -> None:
    """The startup log: how the dashboard is protected (on stderr; the URL alone is on stdout)."""
    from ..web.server import is_loopback

    if security.credentials.required:
        auth = security.credentials.describe()
    elif is_loopback(host):
        auth = "none (loopback only: this machine's users and programs can use it)"
    else:
        auth = "NONE on a network address (--allow-unauthenticated): whoever reaches it can change every message"
    secret = security.secret.source
    if security.secret.generated:
        secret += " (set DELAY_BROKER_WEB_SECRET or --secret-file to keep forms valid across restarts and processes)"
    click.echo(f"  authentication: {auth}", err=True)
    click.echo(f"  answers to Host: {allowed}", err=True)
    click.echo(f"  session and form secret: {secret}", err=True)
    if security.credentials.required and not is_loopback(host):
        click.echo("  plain HTTP: on a network, put a TLS proxy in front (credentials cross it in clear)", err=True)


COMMANDS = [web]
"""This module's commands, in the order ``delay-broker --help`` lists them."""
