"""The attacks of issue 30 on ``delay-broker web``, made by a real headless Chromium against the real command
and a real redis-server: a page on another loopback port tossing the dashboard's cookie and posting a cancel
form, a form from another site, a name rebound to 127.0.0.1, requests without (or with wrong) credentials, and
a network bind without authentication. Each is refused and the targeted message stays parked; the operator's own
use still works. Also the FastAPI app of docs/exposing-the-dashboard.md, run as it is written there."""

from __future__ import annotations

import base64
import contextlib
import html
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, sync_playwright
from playwright.sync_api import Error as PlaywrightError

from delay_broker import DelayStore, Envelope
from delay_broker.embedded import EmbeddedRedis, free_port
from delay_broker.web.security import HEADERS
from tests.web_helpers import DASHBOARD_ENV, WebCommand, request

from .browser import launch

ROOT = Path(__file__).resolve().parents[1]
EVIL = "evil.example"
REBOUND = "rebind.evil.example"
COOKIE = "delay_broker_session"
PASSWORD, TOKEN = "correct horse battery", "t0ken-for-the-proxy"


class OtherSite:
    """An HTTP server on another port of 127.0.0.1 (reached as 127.0.0.1:PORT, or as evil.example:PORT through
    the browser's resolver rules): serves the pages a test puts in ``pages`` (path -> Set-Cookie values, body)."""

    def __init__(self) -> None:
        self.pages: dict[str, tuple[list[str], str]] = {}
        pages = self.pages

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                cookies, body = pages.get(self.path, ([], "nothing here"))
                self.send_response(200)
                for cookie in cookies:
                    self.send_header("Set-Cookie", cookie)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def store(redis_server: EmbeddedRedis) -> Iterator[DelayStore]:
    store = DelayStore(redis_server.client(), namespace=f"websec-{uuid.uuid4().hex[:8]}")
    yield store
    keys = store.keys.all()
    if keys:
        store.client.delete(*keys)


@pytest.fixture(scope="module")
def dashboard(redis_server: EmbeddedRedis, store: DelayStore) -> Iterator[WebCommand]:
    """``delay-broker web`` as a user starts it: 127.0.0.1, nothing set."""
    served = WebCommand(redis_server.url, store.keys.namespace)
    yield served
    served.stop()


@pytest.fixture(scope="module")
def guarded(redis_server: EmbeddedRedis, store: DelayStore, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """``delay-broker web`` with a password (from the environment) and a bearer token (from a file)."""
    token_file = tmp_path_factory.mktemp("auth") / "token"
    token_file.write_text(TOKEN + "\n")
    env = {"DELAY_BROKER_WEB_PASSWORD": PASSWORD, "DELAY_BROKER_WEB_USER": "ops"}
    served = WebCommand(redis_server.url, store.keys.namespace, "--token-file", str(token_file), env=env)
    yield served
    served.stop()


@pytest.fixture(scope="module")
def other_site() -> Iterator[OtherSite]:
    site = OtherSite()
    yield site
    site.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        rules = f"--host-resolver-rules=MAP {EVIL} 127.0.0.1, MAP {REBOUND} 127.0.0.1"
        chromium = launch(playwright, rules)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    context = browser.new_context()
    yield context
    context.close()


@pytest.fixture
def victim(store: DelayStore) -> Iterator[str]:
    """A parked message the attacks aim at."""
    id = f"victim-{uuid.uuid4().hex[:8]}"
    store.park(id, Envelope("emails", b'{"args": ["ann"]}', name="send_welcome"), delay=3600)
    yield id
    store.cancel(id)


def session_of(url: str, headers: dict[str, str] | None = None) -> tuple[str, str]:
    """A genuine session (cookie value, form token), as any program that can reach the dashboard gets one."""
    status, answer, body = request(url + "/messages?state=due", headers=headers)
    assert status == 200, body
    cookie = answer["Set-Cookie"].split(";", 1)[0].split("=", 1)[1]
    (token,) = re.findall(r'name="csrf_token" value="([^"]+)"', body)
    return cookie, token


def cancel_fields(token: str, id: str) -> dict[str, str]:
    """What the dashboard's own "Cancel" posts for ``id``, once confirmed."""
    return {"csrf_token": token, "action": "cancel", "ids": json.dumps([id]), "confirmed": "yes"}


def cancel_data(token: str, id: str) -> bytes:
    return urllib.parse.urlencode(cancel_fields(token, id)).encode()


def cancel_form(dashboard_url: str, token: str, id: str) -> str:
    """A page with the dashboard's cancel form for ``id``, confirmed, behind a button."""
    fields = cancel_fields(token, id)
    inputs = "".join(f'<input type="hidden" name="{k}" value="{html.escape(v)}">' for k, v in fields.items())
    return f'<form method="post" action="{dashboard_url}/actions">{inputs}<button id="prize">Claim</button></form>'


def submit(page: Page) -> Any:
    """Press the attack page's button; the dashboard's response."""
    with page.expect_response(lambda response: response.url.endswith("/actions")) as answer:
        page.click("#prize")
    page.wait_for_load_state()
    return answer.value


def cancel_in_the_dashboard(page: Page, url: str, id: str) -> None:
    """The operator's own cancel, through the pages: it must still work."""
    page.goto(url + "/message?" + urllib.parse.urlencode({"id": id}))
    page.click("#single-cancel")
    page.click("#confirm")
    assert "1 of 1" in page.locator("#result").inner_text()


def clean_environment() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name not in DASHBOARD_ENV}


def session_cookie(context: BrowserContext) -> str:
    (value,) = [cookie["value"] for cookie in context.cookies() if cookie["name"] == COOKIE]
    return value


# -- CSRF: cookie tossing from another port, and forms from other sites ------------------------------------------------


@pytest.mark.parametrize("pair", ["made up", "from the attacker's own session"])
def test_a_page_on_another_loopback_port_cannot_toss_the_cookie_and_cancel(
    dashboard: WebCommand, store: DelayStore, other_site: OtherSite, context: BrowserContext, victim: str, pair: str
) -> None:
    """Issue 30's attack: the operator has the dashboard open (a genuine cookie); a page on another port of
    127.0.0.1 sets the dashboard's cookie to a value it knows (browsers share cookies between the ports of a host,
    and SameSite counts them as one site) and posts a confirmed cancel with the matching token."""
    page = context.new_page()
    page.goto(dashboard.url + "/messages?state=due")
    genuine = session_cookie(context)
    cookie, token = ("x" * 32 + "." + "x" * 43, "x" * 43) if pair == "made up" else session_of(dashboard.url)
    tossed = f"{COOKIE}={cookie}; Path=/; SameSite=Strict"
    other_site.pages["/toss"] = ([tossed], cancel_form(dashboard.url, token, victim))
    page.goto(other_site.url() + "/toss")
    assert session_cookie(context) == cookie != genuine, "the page did replace the dashboard's cookie"

    answer = submit(page)
    assert answer.status == 403
    assert "sent from a same-site page" in page.locator("#error").inner_text()
    assert store.get(victim) is not None, "still parked"

    cancel_in_the_dashboard(page, dashboard.url, victim)  # the operator goes on as before
    assert store.get(victim) is None


def test_without_the_browser_s_word_the_token_alone_refuses_a_tossed_pair(
    dashboard: WebCommand, store: DelayStore, victim: str
) -> None:
    """Sec-Fetch-Site and Origin left out (as a browser that sends neither would): a cookie the server did not
    sign, or a token of another session, is refused by the token check itself."""
    operator_cookie, _ = session_of(dashboard.url)
    _, attacker_token = session_of(dashboard.url)
    made_up = "x" * 32 + "." + "x" * 43
    for cookie, token in ((made_up, "x" * 43), (operator_cookie, attacker_token), (made_up, attacker_token)):
        headers = {"Cookie": f"{COOKIE}={cookie}"}
        status, _, body = request(dashboard.url + "/actions", cancel_data(token, victim), headers)
        assert status == 403 and "CSRF token" in body
    assert store.get(victim) is not None


def test_a_form_from_another_site_is_refused(
    dashboard: WebCommand, store: DelayStore, other_site: OtherSite, context: BrowserContext, victim: str
) -> None:
    """A page of evil.example, holding a genuine token its server fetched, posts the cancel form."""
    _, token = session_of(dashboard.url)
    page = context.new_page()
    page.goto(dashboard.url + "/")
    other_site.pages["/cross"] = ([], cancel_form(dashboard.url, token, victim))
    page.goto(other_site.url(EVIL) + "/cross")
    answer = submit(page)
    assert answer.status == 403 and "sent from a cross-site page" in page.locator("#error").inner_text()
    assert store.get(victim) is not None


def test_a_cross_site_origin_is_refused_whatever_it_carries(
    dashboard: WebCommand, store: DelayStore, victim: str
) -> None:
    """Issue 30's reproduction: a genuine cookie and token, with Origin http://evil.example (with and without
    Sec-Fetch-Site: cross-site)."""
    cookie, token = session_of(dashboard.url)
    data = cancel_data(token, victim)
    for told in ({"Sec-Fetch-Site": "cross-site"}, {}):
        headers = {"Cookie": f"{COOKIE}={cookie}", "Origin": "http://evil.example", **told}
        status, _, body = request(dashboard.url + "/actions", data, headers)
        assert status == 403 and "Refused" in body and "Nothing was done" in body
    assert store.get(victim) is not None
    status, _, body = request(dashboard.url + "/actions", data, {"Cookie": f"{COOKIE}={cookie}"})
    assert status == 200 and "1 of 1" in body, "the same form from no browser, with a genuine pair, is done"


# -- DNS rebinding ---------------------------------------------------------------------------------------------------


def test_a_name_rebound_to_loopback_gets_nothing(
    dashboard: WebCommand, store: DelayStore, context: BrowserContext, victim: str
) -> None:
    """rebind.evil.example resolves to 127.0.0.1 in this browser, as a rebinding attack makes it: the dashboard
    answers 421 with no message and no form token, to pages and forms alike."""
    page = context.new_page()
    answer = page.goto(f"http://{REBOUND}:{dashboard.port}/messages?state=due")
    assert answer is not None and answer.status == 421
    content = page.content()
    assert victim not in content and "csrf_token" not in content and "does not answer to the host" in content
    cookie, token = session_of(dashboard.url)
    data = cancel_data(token, victim)
    headers = {"Host": f"{REBOUND}:{dashboard.port}", "Cookie": f"{COOKIE}={cookie}"}
    assert request(dashboard.url + "/actions", data, headers)[0] == 421
    assert store.get(victim) is not None
    assert request(dashboard.url + "/", headers={"Host": f"localhost:{dashboard.port}"})[0] == 200


# -- authentication --------------------------------------------------------------------------------------------------


def refused_in_the_browser(context: BrowserContext, url: str, victim: str) -> None:
    """Chromium meets a 401 and its challenge: with nothing to answer it gives up (ERR_INVALID_AUTH_CREDENTIALS),
    with credentials it tries them and, refused again, shows the 401. Either way nothing of the dashboard."""
    page = context.new_page()
    try:
        answer = page.goto(url)
    except PlaywrightError as error:
        assert "ERR_INVALID_AUTH_CREDENTIALS" in str(error)
        return
    content = page.content()
    assert answer is not None and answer.status == 401 and victim not in content and "csrf_token" not in content


def test_basic_auth_is_required_and_accepted_when_right(
    guarded: WebCommand, store: DelayStore, browser: Browser, victim: str
) -> None:
    for credentials in (None, {"username": "ops", "password": "wrong"}, {"username": "admin", "password": PASSWORD}):
        context = browser.new_context(http_credentials=credentials)  # type: ignore[arg-type]
        refused_in_the_browser(context, guarded.url + "/messages?state=due", victim)
        context.close()
        given = f"{credentials['username']}:{credentials['password']}" if credentials else ""
        headers = {"Authorization": "Basic " + base64.b64encode(given.encode()).decode()} if credentials else {}
        status, answer, body = request(guarded.url + "/messages?state=due", headers=headers)
        assert status == 401 and victim not in body and "csrf_token" not in body
        challenges = ['Basic realm="delay_broker", charset="UTF-8"', 'Bearer realm="delay_broker"']
        assert answer.get_all("WWW-Authenticate") == challenges
    context = browser.new_context(http_credentials={"username": "ops", "password": PASSWORD})
    page = context.new_page()
    answer = page.goto(guarded.url + "/messages?state=due")
    assert answer is not None and answer.status == 200 and victim in page.content()
    cancel_in_the_dashboard(page, guarded.url, victim)
    assert store.get(victim) is None
    context.close()


def test_a_bearer_token_is_required_and_accepted_when_right(
    guarded: WebCommand, store: DelayStore, browser: Browser, victim: str
) -> None:
    """As a proxy in front would send it, on every request of the browser (forms included)."""
    wrong = browser.new_context(extra_http_headers={"Authorization": "Bearer not-the-token"})
    refused_in_the_browser(wrong, guarded.url + "/messages?state=due", victim)
    wrong.close()
    for header in ("Bearer not-the-token", f"Bearer {TOKEN}x", TOKEN, f"Basic {TOKEN}"):
        assert request(guarded.url + "/", headers={"Authorization": header})[0] == 401, header
    context = browser.new_context(extra_http_headers={"Authorization": f"Bearer {TOKEN}"})
    page = context.new_page()
    cancel_in_the_dashboard(page, guarded.url, victim)
    assert store.get(victim) is None
    context.close()


def test_a_form_token_is_bound_to_the_user_it_was_shown_to(guarded: WebCommand, store: DelayStore, victim: str) -> None:
    basic = {"Authorization": "Basic " + base64.b64encode(f"ops:{PASSWORD}".encode()).decode()}
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    cookie, token = session_of(guarded.url, basic)
    data = cancel_data(token, victim)
    status, _, body = request(guarded.url + "/actions", data, {**bearer, "Cookie": f"{COOKIE}={cookie}"})
    assert status == 403 and "CSRF token" in body
    assert request(guarded.url + "/actions", data, {**basic, "Cookie": f"{COOKIE}={cookie}"})[0] == 200
    assert store.get(victim) is None


# -- binding a network address ---------------------------------------------------------------------------------------


def test_every_interface_without_auth_is_refused_unless_explicitly_allowed(
    redis_server: EmbeddedRedis, store: DelayStore, browser: Browser
) -> None:
    command = [sys.executable, "-m", "delay_broker", "web", "--host", "0.0.0.0", "--port", str(free_port())]
    env = {**clean_environment(), "DELAY_BROKER_REDIS_URL": redis_server.url}
    refused = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and refused.stdout == ""
    assert "refusing to serve the dashboard on 0.0.0.0 without authentication" in refused.stderr

    served = WebCommand(redis_server.url, store.keys.namespace, "--host", "0.0.0.0", "--allow-unauthenticated")
    try:
        page = browser.new_page()
        answer = page.goto(served.url + "/")
        assert answer is not None and answer.status == 200 and page.locator("#parked").count() == 1
        page.close()
    finally:
        log = served.stop()
    assert "authentication: NONE on a network address (--allow-unauthenticated)" in log


# -- headers ---------------------------------------------------------------------------------------------------------


def test_every_response_carries_the_security_headers(dashboard: WebCommand, guarded: WebCommand) -> None:
    responses = {
        "page": request(dashboard.url + "/"),
        "style sheet": request(dashboard.url + "/static/style.css"),
        "not found": request(dashboard.url + "/message?id=nope"),
        "no such file": request(dashboard.url + "/static/../../etc/passwd"),
        "refused form": request(dashboard.url + "/actions", b"action=cancel"),
        "foreign host": request(dashboard.url + "/", headers={"Host": f"{REBOUND}:{dashboard.port}"}),
        "no credentials": request(guarded.url + "/"),
    }
    for what, (status, headers, _) in responses.items():
        assert status in (200, 401, 403, 404, 421), what
        for name, value in HEADERS.items():
            assert headers[name] == value, (what, name)
    assert "frame-ancestors 'none'" in HEADERS["content-security-policy"] and "script-src" not in str(HEADERS)


# -- mounted in a FastAPI app, as the docs show ---------------------------------------------------------------------


def doc_example(name: str) -> str:
    text = (ROOT / "docs" / "exposing-the-dashboard.md").read_text()
    found = re.search(rf"<!-- example: {name} -->\n```python\n(.*?)```", text, re.DOTALL)
    assert found, f"no {name} example in docs/exposing-the-dashboard.md"
    return found.group(1)


@pytest.fixture
def fastapi_app(redis_server: EmbeddedRedis, store: DelayStore, tmp_path: Path) -> Iterator[str]:
    (tmp_path / "docs_app.py").write_text(doc_example("fastapi"))
    port = free_port()
    env = {
        **clean_environment(),
        "DELAY_BROKER_REDIS_URL": redis_server.url,
        "DELAY_BROKER_NAMESPACE": store.keys.namespace,
        "ADMIN_PASSWORD": PASSWORD,
        "DELAY_BROKER_WEB_SECRET": "the same secret in every worker",
    }
    command = [sys.executable, "-m", "uvicorn", "docs_app:app", "--port", str(port), "--workers", "2"]
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        with contextlib.suppress(OSError):
            if request(url + "/whoami")[0] == 401:  # up, and guarding
                break
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[1]
        time.sleep(0.2)
    yield url
    process.terminate()
    process.communicate(timeout=15)


def test_the_fastapi_example_guards_the_mount_and_its_forms_work(
    fastapi_app: str, store: DelayStore, browser: Browser, victim: str
) -> None:
    """The docs' app, run by uvicorn with two workers (one secret, from the environment): /delays needs the
    app's admin like its own routes; once in, a cancel goes through the mount."""
    for path in ("/delays", "/delays/", "/delays/messages?state=due", "/delays/static/style.css"):
        status, _, body = request(fastapi_app + path)
        assert status == 401 and victim not in body, path
    assert request(fastapi_app + "/", headers={"Host": f"{REBOUND}"})[0] == 400, "TrustedHostMiddleware"
    context = browser.new_context(http_credentials={"username": "admin", "password": PASSWORD})
    page = context.new_page()
    whoami = page.goto(fastapi_app + "/whoami")
    assert whoami is not None and whoami.json() == {"user": "admin"}
    for _ in range(3):  # requests spread over both workers: the one secret signs for all
        page.goto(fastapi_app + "/delays/messages?state=due")
        assert victim in page.content()
    cancel_in_the_dashboard(page, fastapi_app + "/delays", victim)
    assert store.get(victim) is None
    (cookie,) = [cookie for cookie in context.cookies() if cookie["name"] == COOKIE]
    assert cookie["path"] == "/delays" and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    context.close()
