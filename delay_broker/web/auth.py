"""Authentication for ``delay-broker web``: HTTP basic auth, a bearer token, or both.

The password and the token come from the environment or from a file, never from the command line (where any
user of the machine can read them in the process list), and are compared in constant time. An app that mounts
the dashboard (:func:`delay_broker.web.create_app`) authenticates with its own means instead; see
docs/exposing-the-dashboard.md.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from starlette.authentication import AuthCredentials, AuthenticationBackend, AuthenticationError, SimpleUser
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp

from ..errors import ConfigurationError
from .secret import read_first_line

PASSWORD_ENV = "DELAY_BROKER_WEB_PASSWORD"
TOKEN_ENV = "DELAY_BROKER_WEB_TOKEN"
REALM = "delay_broker"
TOKEN_USER = "bearer-token"
"""Who a request that showed the bearer token is, for the form tokens bound to the user."""

logger = logging.getLogger("delay_broker.web")


@dataclass(frozen=True)
class Credentials:
    """What ``delay-broker web`` asks for: a user and password (basic auth), a bearer token, both, or neither.

    Parameters:
      user: the basic-auth user name.
      password: the basic-auth password (None: no basic auth).
      token: the bearer token (None: no bearer token).
    """

    user: str = "admin"
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)

    @property
    def required(self) -> bool:
        return self.password is not None or self.token is not None

    def describe(self) -> str:
        ways = ([f"basic auth as user {self.user!r}"] if self.password is not None else []) + (
            ["a bearer token"] if self.token is not None else []
        )
        return " or ".join(ways) or "none"

    def check_basic(self, user: str, password: str) -> bool:
        if self.password is None:
            return False
        # Both compared, whatever the first gives: the time taken says nothing about which was wrong.
        right_user = _same(user, self.user)
        right_password = _same(password, self.password)
        return right_user & right_password

    def check_token(self, token: str) -> bool:
        return self.token is not None and _same(token, self.token)


def load_credentials(
    user: str, password_file: str | None, token_file: str | None, environ: Mapping[str, str] = os.environ
) -> Credentials:
    """Credentials from ``DELAY_BROKER_WEB_PASSWORD`` or a password file, and ``DELAY_BROKER_WEB_TOKEN`` or a
    token file (each file's first line). ConfigurationError when both ways give one, a variable is set but
    empty, a file cannot be read, or the user name holds a colon."""
    if not user or ":" in user:
        raise ConfigurationError(f"the dashboard's user name must be non-empty and hold no colon: {user!r}")
    password = _one_of(environ, PASSWORD_ENV, password_file, "password file")
    token = _one_of(environ, TOKEN_ENV, token_file, "token file")
    return Credentials(user, password, token)


def _one_of(environ: Mapping[str, str], variable: str, path: str | None, what: str) -> str | None:
    value = environ.get(variable)
    if value is not None and path is not None:
        raise ConfigurationError(f"both {variable} and a {what} are given: give one")
    if value is not None:
        if not value.strip():
            raise ConfigurationError(f"{variable} is set but empty")
        return value.strip()
    return None if path is None else read_first_line(path, what)


class CredentialsBackend(AuthenticationBackend):
    """A Starlette authentication backend that lets through only requests with the right credentials: every
    other one (none given, wrong ones, another scheme) raises AuthenticationError, answered with 401."""

    def __init__(self, credentials: Credentials) -> None:
        self.credentials = credentials

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, SimpleUser]:
        scheme, _, value = conn.headers.get("authorization", "").partition(" ")
        scheme, value = scheme.lower(), value.strip()
        if scheme == "basic" and self.credentials.password is not None:
            user, password = _basic(value)
            if self.credentials.check_basic(user, password):
                return AuthCredentials(["authenticated"]), SimpleUser(user)
            self._refused(conn, "user or password")
        if scheme == "bearer" and self.credentials.token is not None:
            if self.credentials.check_token(value):
                return AuthCredentials(["authenticated"]), SimpleUser(TOKEN_USER)
            self._refused(conn, "bearer token")
        raise AuthenticationError("Authentication required.")

    def _refused(self, conn: HTTPConnection, what: str) -> None:
        client = conn.client.host if conn.client else "?"
        logger.warning("delay_broker dashboard: wrong %s from %s", what, client)
        raise AuthenticationError(f"Wrong {what}.")


def _basic(value: str) -> tuple[str, str]:
    try:
        decoded = base64.b64decode(value, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise AuthenticationError("Malformed basic credentials.") from None
    user, colon, password = decoded.partition(":")
    if not colon:
        raise AuthenticationError("Malformed basic credentials.")
    return user, password


def _same(given: str, expected: str) -> bool:
    # Digests first: compare_digest's time then depends on neither value's length.
    return hmac.compare_digest(_digest(given), _digest(expected))


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


def require_auth(app: ASGIApp, credentials: Credentials) -> ASGIApp:
    """``app`` behind the credentials: any request without them gets 401 and a challenge for each way given."""

    def challenge(conn: HTTPConnection, error: AuthenticationError) -> Response:
        response = PlainTextResponse(f"{error} This dashboard needs {credentials.describe()}.", 401)
        if credentials.password is not None:
            response.headers.append("WWW-Authenticate", f'Basic realm="{REALM}", charset="UTF-8"')
        if credentials.token is not None:
            response.headers.append("WWW-Authenticate", f'Bearer realm="{REALM}"')
        return response

    return AuthenticationMiddleware(app, CredentialsBackend(credentials), on_error=challenge)
