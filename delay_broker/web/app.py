"""The dashboard: a Starlette (ASGI) app over the operations layer. Pages are rendered on the server with
Jinja2 (autoescaped: stored data is always shown as text), charts are inline SVG, and no asset comes from
anywhere but the app itself. Every write is a POST from the dashboard's own origin with a form token signed for the
browser's session (see csrf.py and security.py); a read-only app refuses them all."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from importlib import resources
from typing import Any, TypeVar

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..decoding import decode_payload
from ..display import describe_filter
from ..errors import DelayBrokerError, InvalidMessage, StoreError
from ..operations import BulkResult, Ids, MessageFilter, Operations
from ..schedules import RuntimeSchedules, schedule_rows
from ..store import DelayStore, MessageInfo, check_id
from . import csrf
from .charts import bar_chart
from .secret import Secret, resolve_secret
from .security import SecurityHeaders, origin_refusal
from .security import trusted_origins as trusted_origins_of
from .views import (
    filter_fields,
    filter_from,
    filter_query,
    format_age,
    format_time,
    histogram_bars,
    lateness_bars,
    message_view,
    pretty_json,
)

T = TypeVar("T")

PAGE_SIZE = 50
PAGE_SCAN = 200_000
"""Index entries one page of a filtered list may examine per shard; past it, the page says so and offers
to go on. Keeps every request short on a million messages whatever the filter."""

ACTIONS = {
    "cancel": ("Cancel", "due"),
    "run_now": ("Run now", "due"),
    "requeue": ("Requeue", "dead"),
    "purge": ("Purge", "dead"),
}
"""Bulk and single actions: their button label and the state they apply to."""


def create_app(
    store: DelayStore,
    *,
    read_only: bool = False,
    title: str = "delay_broker",
    secret: str | bytes | Secret | None = None,
    trusted_origins: Iterable[str] = (),
) -> Starlette:
    """The dashboard for one store. Mount it in your ASGI app (FastAPI, Starlette) under any path, behind your
    app's authentication, or serve it with ``delay-broker web``; :func:`delay_broker.web.wsgi_app` wraps it for
    Django or Flask (docs/exposing-the-dashboard.md shows both).

    Parameters:
      store: the store to show and act on.
      read_only: show everything, refuse every write (403).
      title: the name in each page's header.
      secret: signs the session cookie and the form tokens (at least 16 characters). Default:
        ``DELAY_BROKER_WEB_SECRET``, else one generated for the process (and a warning logged): every process
        serving the same dashboard needs the same secret.
      trusted_origins: origins (``https://name[:port]``) whose forms are accepted besides the request's own, for
        a proxy that rewrites the Host header.
    """
    directory = resources.files("delay_broker.web")
    environment = Environment(
        loader=FileSystemLoader(str(directory.joinpath("templates"))),
        autoescape=select_autoescape(default=True, default_for_string=True),
    )
    environment.filters.update(time=format_time, age=format_age, pretty=pretty_json)
    dashboard = _Dashboard(
        store, read_only, title, environment, csrf.Csrf(resolve_secret(secret)), trusted_origins_of(trusted_origins)
    )
    routes = [
        Route("/", dashboard.overview, name="overview"),
        Route("/messages", dashboard.messages, name="messages"),
        Route("/message", dashboard.message, name="message"),
        Route("/schedules", dashboard.schedules, name="schedules"),
        Route("/actions", dashboard.act, methods=["POST"], name="actions"),
        Route("/schedules/actions", dashboard.act_on_schedule, methods=["POST"], name="schedule_actions"),
        Mount("/static", app=StaticFiles(directory=str(directory.joinpath("static"))), name="static"),
    ]

    async def unavailable(request: Request, error: Exception) -> Response:
        # Redis down, failing over or refusing: a page that says so, not a bare 500 with a traceback in the log.
        return dashboard.render(request, "error.html", status=503, message=f"The store cannot be read now: {error}")

    return Starlette(
        routes=routes, middleware=[Middleware(SecurityHeaders)], exception_handlers={StoreError: unavailable}
    )


@dataclasses.dataclass
class _Dashboard:
    store: DelayStore
    read_only: bool
    title: str
    environment: Environment
    tokens: csrf.Csrf
    trusted_origins: frozenset[str]

    @property
    def ops(self) -> Operations:
        return Operations(self.store)

    async def call(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        # The store's client blocks: keep it off the event loop.
        return await run_in_threadpool(partial(function, *args, **kwargs))

    def render(self, request: Request, template: str, status: int = 200, **context: Any) -> Response:
        base = request.scope.get("root_path", "")
        page = self.environment.get_template(template).render(
            base=base,
            title=self.title,
            namespace=self.store.keys.namespace,
            read_only=self.read_only,
            csrf_field=csrf.FIELD,
            csrf_token=self.tokens.token(request),
            **context,
        )
        # The security headers (content policy and others) are SecurityHeaders' for every response.
        return self.tokens.remember(request, HTMLResponse(page, status_code=status))

    # -- pages ---------------------------------------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        stats = await self.call(self.store.stats)
        lateness = lateness_bars(await self.call(self.store.promotion_lateness))
        return self.render(
            request,
            "overview.html",
            stats=stats,
            due_chart=bar_chart(histogram_bars(stats), danger="overdue"),
            lateness_chart=bar_chart(lateness),
        )

    async def messages(self, request: Request) -> Response:
        try:
            filter = filter_from(request.query_params, await self.call(self.store.now_ms))
            page = await self.call(
                self.ops.find,
                filter,
                cursor=request.query_params.get("cursor") or None,
                limit=PAGE_SIZE,
                max_scan=PAGE_SCAN,
                headers_only=True,
            )
        except ValueError as error:
            return self.render(request, "error.html", status=400, message=str(error))
        return self.render(
            request,
            "messages.html",
            filter=filter,
            query=filter_query(filter),
            params=request.query_params,
            messages=[message_view(info) for info in page.messages],
            cursor=page.cursor,
            examined=page.examined,
            actions=[(name, label) for name, (label, state) in ACTIONS.items() if state == filter.state],
        )

    async def message(self, request: Request) -> Response:
        id = request.query_params.get("id", "")
        try:
            info: MessageInfo | None = await self.call(self.store.get, id) if id else None
        except InvalidMessage as error:
            return self.render(request, "error.html", status=400, message=str(error))
        if info is None:
            return self.render(request, "error.html", status=404, message=f"No message {id!r} in this namespace.")
        envelope = info.envelope
        decoded = None if envelope is None else decode_payload(envelope.framework, envelope.payload)
        actions = [(name, label) for name, (label, state) in ACTIONS.items() if state == info.state]
        return self.render(
            request, "message.html", message=message_view(info), decoded=decoded, envelope=envelope, actions=actions
        )

    async def schedules(self, request: Request) -> Response:
        rows = await self.call(schedule_rows, self.store)
        return self.render(request, "schedules.html", schedules=rows)

    # -- writes --------------------------------------------------------------------------------------------------

    async def _form(self, request: Request) -> dict[str, str] | Response:
        if self.read_only:
            return self.render(request, "error.html", status=403, message="This dashboard is read-only.")
        refusal = origin_refusal(request, self.trusted_origins)
        if refusal is not None:
            # Before the body is read: nothing of a forged form is looked at.
            message = f"Refused: {refusal}. Nothing was done; use the dashboard's own pages."
            return self.render(request, "error.html", status=403, message=message)
        form = await request.form()
        fields = {key: value for key, value in form.items() if isinstance(value, str)}
        if not self.tokens.valid(request, fields.get(csrf.FIELD)):
            return self.render(
                request, "error.html", status=403, message="Missing or wrong CSRF token: reload the page."
            )
        return fields

    async def act(self, request: Request) -> Response:
        fields = await self._form(request)
        if isinstance(fields, Response):
            return fields
        action = fields.get("action", "")
        if action not in ACTIONS:
            return self.render(request, "error.html", status=400, message=f"Unknown action {action!r}.")
        label, state = ACTIONS[action]
        try:
            ids = ids_from(fields)
            filter = None if ids else filter_from(fields, await self.call(self.store.now_ms))
        except ValueError as error:
            return self.render(request, "error.html", status=400, message=str(error))
        if filter is not None and filter.state != state:
            return self.render(request, "error.html", status=400, message=f"{label} applies to {state} messages.")
        back = f"{request.scope.get('root_path', '')}/messages?{filter_query(filter)}" if filter else None
        if fields.get("confirmed") != "yes":
            return await self._confirm(request, action, label, ids, filter, fields)
        targets: Ids | Response
        if ids:
            targets = ids
        else:
            assert filter is not None
            targets = await self._confirmed(request, filter, fields, back)
            if isinstance(targets, Response):
                return targets
        try:
            result = await self.call(self._apply, action, targets)
        except DelayBrokerError as error:
            return self.render(request, "error.html", status=409, message=str(error))
        return self.render(request, "result.html", result=result, label=label, back=back)

    async def _confirm(
        self,
        request: Request,
        action: str,
        label: str,
        ids: list[str] | None,
        filter: MessageFilter | None,
        fields: dict[str, str],
    ) -> Response:
        """The page that asks before acting, carrying what the submit acts on."""
        if ids:
            count, carried = len(ids), {"ids": fields["ids"]}
        else:
            assert filter is not None
            # The submit is held to exactly these messages, by a digest of their ids. The window goes on as the
            # instants it meant now, so a relative time is not read again against the submit's now.
            matched = await self.call(self.ops.select, filter)
            count = len(matched)
            carried = {**filter_fields(filter), "scope": "filter", "count": str(count), "digest": digest(matched)}
        return self.render(
            request,
            "confirm.html",
            action=action,
            label=label,
            count=count,
            ids=ids,
            carried=carried,
            filter=filter,
            described=describe_filter(filter) if filter else None,
        )

    async def _confirmed(
        self, request: Request, filter: MessageFilter, fields: dict[str, str], back: str | None
    ) -> dict[str, str] | Response:
        """The messages a filter matches now, if they are those the operator confirmed; else the page saying
        that nothing was done."""
        confirmed = fields.get("count", "")
        # isdigit() takes "²", which int() refuses: only ASCII digits, as the confirm page writes them.
        if not (confirmed.isascii() and confirmed.isdecimal()) or not fields.get("digest"):
            message = "This form does not say which messages were confirmed: nothing was done. Confirm again."
            return self.render(request, "error.html", status=400, message=message, back=back)
        selected = await self.call(self.ops.select, filter)
        if digest(selected) != fields["digest"]:
            # Parked, promoted or moved since the confirm: not what was said yes to. The operator looks again.
            now = (
                f"{len(selected):,} message(s), not the {int(confirmed):,} you confirmed"
                if len(selected) != int(confirmed)
                else f"other messages than the {int(confirmed):,} you confirmed (as many left it as came in)"
            )
            message = f"The filter now matches {now}: nothing was done. Look at the list again and confirm anew."
            return self.render(request, "error.html", status=409, message=message, back=back)
        return selected

    def _apply(self, action: str, targets: Ids) -> BulkResult:
        ops = self.ops
        if action == "cancel":
            return ops.cancel(targets)
        if action == "run_now":
            return ops.run_now(targets)
        if action == "requeue":
            return ops.requeue(targets)
        return ops.purge(targets)

    async def act_on_schedule(self, request: Request) -> Response:
        fields = await self._form(request)
        if isinstance(fields, Response):
            return fields
        name, action = fields.get("name", ""), fields.get("action", "")
        schedules = RuntimeSchedules(self.store)
        methods = {"pause": schedules.pause, "resume": schedules.resume, "run_now": schedules.run_now}
        if action not in methods:
            return self.render(request, "error.html", status=400, message=f"Unknown action {action!r}.")
        try:
            await self.call(methods[action], name)
        except DelayBrokerError as error:
            return self.render(request, "error.html", status=409, message=str(error))
        return RedirectResponse(f"{request.scope.get('root_path', '')}/schedules", status_code=303)


def digest(selected: Mapping[str, str]) -> str:
    """Names a set of ids (in any order) in a form field: the confirm page carries it, and the submit acts only
    if its own selection has the same."""
    hashed = hashlib.sha256()
    for id in sorted(selected):
        encoded = id.encode("utf-8", "surrogatepass")
        hashed.update(len(encoded).to_bytes(4, "big") + encoded)
    return hashed.hexdigest()


def ids_from(fields: dict[str, str]) -> list[str] | None:
    """The messages an action names: a JSON list in ``ids`` (one message's page), or None for the filter when
    ``scope`` is ``filter`` (the bulk form). JSON keeps an id exact: a form field's newlines are rewritten on
    submission, and an id may be blank or hold one. Anything else is refused rather than read as "everything"."""
    if "ids" in fields:
        try:
            ids = json.loads(fields["ids"])
        except ValueError:
            ids = None
        if not isinstance(ids, list) or not ids or not all(isinstance(id, str) for id in ids):
            raise ValueError("ids must be a non-empty JSON list of message ids")
        # Every id checked before any is acted on: one the store refuses must not stop an action half done.
        for id in ids:
            try:
                check_id(id)
                id.encode("utf-8")
            except InvalidMessage as error:
                raise ValueError(f"Nothing was done: {error}") from None
            except UnicodeEncodeError:
                raise ValueError(f"Nothing was done: message id {id!r} is not valid UTF-8 text") from None
        return ids
    if fields.get("scope") != "filter":
        raise ValueError("An action needs the messages it applies to: ids, or scope=filter with a filter.")
    return None


__all__ = ["create_app"]
