"""The operations dashboard (``pip install 'delay-broker[web]'``): ``delay-broker web``, or mounted in your app,
behind your app's own authentication (docs/exposing-the-dashboard.md shows FastAPI and Django). Every process
serving it needs the same secret: set ``DELAY_BROKER_WEB_SECRET`` (or pass ``secret=``).

# FastAPI / Starlette (ASGI)
from delay_broker.web import create_app
app.mount("/delays", create_app(DelayStore.from_url(REDIS_URL, namespace="celery"), read_only=True))

# Django / Flask (WSGI)
from delay_broker.web import wsgi_app
application = wsgi_app(store)          # e.g. under a path with werkzeug's DispatcherMiddleware
"""

from __future__ import annotations

from typing import Any

from ..store import DelayStore
from .app import create_app


def wsgi_app(store: DelayStore, **options: Any) -> Any:
    """The dashboard as a WSGI application (a2wsgi's adapter around :func:`create_app`, which takes ``options``)."""
    from a2wsgi import ASGIMiddleware

    return ASGIMiddleware(create_app(store, **options))  # type: ignore[arg-type]


__all__ = ["create_app", "wsgi_app"]
