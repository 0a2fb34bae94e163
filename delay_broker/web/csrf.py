"""CSRF protection for the dashboard's forms: a double-submit token.

Every page sets a random token in a cookie (HttpOnly, SameSite=Strict) and puts the same token in each form;
a POST is accepted only when the form's token equals the cookie's. Another site can make a browser send the
cookie, but cannot read it to put it in the form (and SameSite=Strict keeps the cookie off cross-site posts).
"""

from __future__ import annotations

import hmac
import secrets

from starlette.requests import Request
from starlette.responses import Response

COOKIE = "delay_broker_csrf"
FIELD = "csrf_token"


def token(request: Request) -> str:
    """The request's token: the cookie's, or a new one (set on the response with :func:`remember`)."""
    existing = request.cookies.get(COOKIE)
    if existing and len(existing) == 43 and existing.replace("-", "").replace("_", "").isalnum():
        return existing
    fresh = request.state.__dict__.setdefault("csrf_token", secrets.token_urlsafe(32))
    return str(fresh)


def remember(request: Request, response: Response) -> Response:
    """Set the token cookie when the request did not carry one."""
    value = token(request)
    if request.cookies.get(COOKIE) != value:
        path = request.scope.get("root_path") or "/"
        response.set_cookie(COOKIE, value, httponly=True, samesite="strict", path=path)
    return response


def valid(request: Request, submitted: object) -> bool:
    cookie = request.cookies.get(COOKIE)
    return bool(cookie) and isinstance(submitted, str) and hmac.compare_digest(cookie or "", submitted)
