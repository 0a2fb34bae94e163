"""CSRF protection for the dashboard's forms: a session the server signed, and form tokens bound to it.

Every page sets a session cookie (HttpOnly, SameSite=Strict) holding a random id and the server's HMAC of it:
a cookie the server did not issue, such as one a page on another port of the same host set ("cookie tossing";
browsers keep cookies per host, not per port), is known as foreign, never trusted, and replaced by the next
page. Each form carries HMAC(secret, session id, user): a token is good with the session it was made for alone,
and only for the user it was shown to when the server authenticates, so a cookie/token pair made up by another
page, or a token from someone else's session, is refused. The browser also says where a POST was sent from,
which :mod:`delay_broker.web.security` checks first.
"""

from __future__ import annotations

import base64
import hmac
import secrets

from starlette.requests import Request
from starlette.responses import Response

from .secret import Secret

COOKIE = "delay_broker_session"
FIELD = "csrf_token"
_SESSION_BYTES = 24
_SESSION_CHARS = 32
"""A session id: 24 random bytes, URL-safe base64 without padding."""


class Csrf:
    """Issues and checks the session cookie and form tokens of one dashboard.

    Parameters:
      secret: the server secret (see :mod:`delay_broker.web.secret`); two apps with the same secret accept each
        other's sessions and tokens, as several processes behind one address must.
    """

    def __init__(self, secret: Secret) -> None:
        # Two keys derived from one secret: a session cookie's MAC can never pass for a form token.
        self._session_key = hmac.digest(secret.key, b"delay_broker session cookie", "sha256")
        self._form_key = hmac.digest(secret.key, b"delay_broker form token", "sha256")

    def session(self, request: Request) -> str:
        """The request's session id: its cookie's when this server signed it, else a new one (the same for the
        whole request, set on its response by :meth:`remember`)."""
        issued = self._issued(request.cookies.get(COOKIE, ""))
        if issued is not None:
            return issued
        return str(request.state.__dict__.setdefault("delay_broker_session", secrets.token_urlsafe(_SESSION_BYTES)))

    def token(self, request: Request) -> str:
        """The token the request's forms carry."""
        return _mac(self._form_key, f"{self.session(request)}\0{user_of(request)}")

    def remember(self, request: Request, response: Response) -> Response:
        """Set the session cookie when the request did not carry this server's own."""
        session = self.session(request)
        value = f"{session}.{_mac(self._session_key, session)}"
        if request.cookies.get(COOKIE) != value:
            response.set_cookie(
                COOKIE,
                value,
                httponly=True,
                samesite="strict",
                path=request.scope.get("root_path") or "/",
                secure=request.url.scheme == "https",
            )
        return response

    def valid(self, request: Request, submitted: object) -> bool:
        """Whether a form's token is the one this server made for the request's own session and user."""
        session = self._issued(request.cookies.get(COOKIE, ""))
        if session is None or not isinstance(submitted, str):
            return False
        expected = _mac(self._form_key, f"{session}\0{user_of(request)}")
        return hmac.compare_digest(_bytes(submitted), _bytes(expected))

    def _issued(self, cookie: str) -> str | None:
        """The session id of a cookie this server signed; None for any other."""
        session, _, mac = cookie.partition(".")
        if len(session) != _SESSION_CHARS:
            return None
        return session if hmac.compare_digest(_bytes(mac), _bytes(_mac(self._session_key, session))) else None


def user_of(request: Request) -> str:
    """Who the request is authenticated as (Starlette's ``scope["user"]``, set by ``delay-broker web``'s
    authentication or a host app's AuthenticationMiddleware); empty when nobody is."""
    user = request.scope.get("user")
    if user is None or not getattr(user, "is_authenticated", False):
        return ""
    try:
        return str(user.identity)
    except (AttributeError, NotImplementedError):  # a user class of the host app without an identity
        return str(getattr(user, "display_name", ""))


def _mac(key: bytes, text: str) -> str:
    digest = hmac.digest(key, text.encode("utf-8", "surrogatepass"), "sha256")
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _bytes(text: str) -> bytes:
    # compare_digest takes ASCII str only; what a client sends may be anything.
    return text.encode("utf-8", "surrogatepass")
