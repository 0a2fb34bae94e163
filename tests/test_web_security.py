"""The dashboard's security parts, one by one: signed sessions and form tokens, the same-origin check, the Host
allow-list, credentials, the server secret and what counts as loopback. Requests are Starlette's own, built
from ASGI scopes; the running server, the browser and the CLI are tested in integration/test_dashboard_security.py
and tests/test_web_cli.py."""

from __future__ import annotations

import asyncio
import base64
import logging
from pathlib import Path
from typing import Any

import pytest
from starlette.authentication import AuthenticationError, SimpleUser
from starlette.requests import Request
from starlette.responses import Response

from delay_broker.errors import ConfigurationError
from delay_broker.web.auth import CredentialsBackend, load_credentials
from delay_broker.web.csrf import COOKIE, Csrf
from delay_broker.web.secret import SECRET_ENV, Secret, read_secret_file, resolve_secret
from delay_broker.web.security import AllowedHosts, origin_refusal, split_host, trusted_origins
from delay_broker.web.server import default_hosts, display_host, is_loopback, is_wildcard

SECRET = resolve_secret("a secret of the dashboard, long enough")


def request(headers: dict[str, str] | None = None, *, scheme: str = "http", user: Any = None) -> Request:
    headers = {"host": "127.0.0.1:8471", **(headers or {})}
    scope: dict[str, Any] = {
        "type": "http",
        "method": "POST",
        "scheme": scheme,
        "path": "/actions",
        "root_path": "",
        "query_string": b"",
        "headers": [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()],
        "server": ("127.0.0.1", 8471),
    }
    if user is not None:
        scope["user"] = user
    return Request(scope)


def issued(csrf: Csrf, user: Any = None) -> tuple[str, str]:
    """A session cookie (``name=value``) and form token, as a page of the dashboard gives them."""
    first = request(user=user)
    token = csrf.token(first)
    cookie = csrf.remember(first, Response()).headers["set-cookie"].split(";", 1)[0]
    return cookie, token


# -- sessions and form tokens --------------------------------------------------------------------------------------


def test_a_token_is_good_with_the_session_it_was_made_for() -> None:
    csrf = Csrf(SECRET)
    cookie, token = issued(csrf)
    assert csrf.valid(request({"cookie": cookie}), token)
    assert Csrf(resolve_secret("a secret of the dashboard, long enough")).valid(request({"cookie": cookie}), token), (
        "another process with the same secret accepts it"
    )


def test_a_pair_made_up_by_another_page_is_refused() -> None:
    """The attack of issue 30: a page on another port sets the cookie to a value it knows and posts the same
    value as the token. The old double-submit check compared the two; now neither is one the server made."""
    csrf = Csrf(SECRET)
    for made_up in ("x" * 43, "x" * 32 + "." + "x" * 43):
        assert not csrf.valid(request({"cookie": f"{COOKIE}={made_up}"}), made_up)
    # A session id of the right shape with a MAC of its own making, and a token derived from it, still fail.
    fake = "A" * 32 + "." + base64.urlsafe_b64encode(b"\0" * 32).rstrip(b"=").decode()
    assert not csrf.valid(request({"cookie": f"{COOKIE}={fake}"}), "A" * 43)


def test_a_token_from_another_session_or_secret_is_refused() -> None:
    csrf = Csrf(SECRET)
    victim_cookie, victim_token = issued(csrf)
    attacker_cookie, attacker_token = issued(csrf)
    assert not csrf.valid(request({"cookie": victim_cookie}), attacker_token)
    assert not csrf.valid(request({"cookie": attacker_cookie}), victim_token)
    other = Csrf(resolve_secret("another server's secret, as long"))
    other_cookie, other_token = issued(other)
    assert not csrf.valid(request({"cookie": other_cookie}), other_token)


def test_a_token_is_bound_to_the_user_it_was_shown_to() -> None:
    csrf = Csrf(SECRET)
    cookie, token = issued(csrf, SimpleUser("ann"))
    assert csrf.valid(request({"cookie": cookie}, user=SimpleUser("ann")), token)
    assert not csrf.valid(request({"cookie": cookie}, user=SimpleUser("bob")), token)
    assert not csrf.valid(request({"cookie": cookie}), token)


@pytest.mark.parametrize("token", [None, "", "é" * 43, 42, "\ud800"])
def test_a_missing_or_odd_token_is_refused_without_an_error(token: object) -> None:
    csrf = Csrf(SECRET)
    cookie, _ = issued(csrf)
    assert not csrf.valid(request({"cookie": cookie}), token)


def test_a_tampered_session_cookie_is_replaced_and_a_good_one_kept() -> None:
    csrf = Csrf(SECRET)
    cookie, _ = issued(csrf)
    name, value = cookie.split("=", 1)
    session, mac = value.split(".")
    tampered = request({"cookie": f"{name}={session[:-1]}{'B' if session[-1] != 'B' else 'C'}.{mac}"})
    assert csrf.session(tampered) != session
    set_cookie = csrf.remember(tampered, Response()).headers["set-cookie"]
    assert set_cookie.startswith(f"{COOKIE}=") and "httponly" in set_cookie.lower()
    assert "samesite=strict" in set_cookie.lower() and "Path=/" in set_cookie
    kept = request({"cookie": cookie})
    assert csrf.session(kept) == session and "set-cookie" not in csrf.remember(kept, Response()).headers


def test_the_cookie_is_secure_over_https() -> None:
    csrf = Csrf(SECRET)
    over_tls = request(scheme="https")
    assert "secure" in csrf.remember(over_tls, Response()).headers["set-cookie"].lower()


# -- the secret ----------------------------------------------------------------------------------------------------


def test_the_secret_comes_from_the_argument_the_environment_or_is_generated(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(SECRET_ENV, "from the environment, long enough")
    assert resolve_secret(None).source == f"from {SECRET_ENV}"
    assert resolve_secret(None).key == resolve_secret("from the environment, long enough").key
    assert resolve_secret("given here, and long enough").source == "given"
    monkeypatch.delenv(SECRET_ENV)
    with caplog.at_level(logging.WARNING, logger="delay_broker.web"):
        generated = resolve_secret(None)
    assert generated.generated and generated.key != resolve_secret(None, warn=False).key
    assert "one was generated for this process" in caplog.text
    assert "key" not in repr(generated).split("source")[0].replace("Secret(", ""), "the key is never shown"


def test_a_short_or_empty_secret_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="too short: give at least 16"):
        resolve_secret("short")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ConfigurationError, match="is empty"):
        read_secret_file(str(empty))
    with pytest.raises(ConfigurationError, match="cannot read"):
        read_secret_file(str(tmp_path / "missing"))
    good = tmp_path / "good"
    good.write_text("  a secret kept in a file  \nsecond line ignored\n")
    assert read_secret_file(str(good)).key == resolve_secret("a secret kept in a file").key


def test_a_secret_object_is_taken_as_it_is() -> None:
    secret = Secret(b"k" * 32, "given")
    assert resolve_secret(secret) is secret


# -- the origin of a POST ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "scheme", "refused"),
    [
        ({"sec-fetch-site": "same-origin", "origin": "null"}, "http", False),  # a browser, under no-referrer
        ({"sec-fetch-site": "same-origin"}, "http", False),
        ({"sec-fetch-site": "same-site", "origin": "http://127.0.0.1:3000"}, "http", True),  # another port
        ({"sec-fetch-site": "cross-site", "origin": "http://evil.example"}, "http", True),
        ({"sec-fetch-site": "none"}, "http", True),
        ({"sec-fetch-site": "cross-site", "origin": "http://127.0.0.1:8471"}, "http", True),  # the browser knows
        ({"origin": "http://127.0.0.1:8471"}, "http", False),  # a browser without Sec-Fetch-*
        ({"origin": "http://evil.example"}, "http", True),
        ({"origin": "http://127.0.0.1:3000"}, "http", True),
        ({"origin": "http://localhost:8471"}, "http", True),  # another origin, though the same machine
        ({"origin": "https://127.0.0.1:8471"}, "http", False),  # TLS ended at a proxy
        ({"origin": "http://127.0.0.1:8471"}, "https", True),  # a page in clear posting into TLS
        ({"origin": "null"}, "http", False),  # says nothing: the token decides
        ({"origin": "file://"}, "http", True),
        ({"origin": "http://[::1"}, "http", True),
        ({}, "http", False),  # no browser: the token decides
    ],
)
def test_a_post_must_come_from_the_dashboard_s_own_origin(headers: dict[str, str], scheme: str, refused: bool) -> None:
    assert (origin_refusal(request(headers, scheme=scheme)) is not None) == refused


def test_default_ports_and_trusted_origins() -> None:
    on_default_port = request({"host": "dash.example.com", "origin": "https://dash.example.com"})
    assert origin_refusal(on_default_port) is None
    rewritten = request({"host": "127.0.0.1:8471", "origin": "https://dash.example.com"})
    assert origin_refusal(rewritten) is not None
    assert origin_refusal(rewritten, trusted_origins(["https://DASH.example.com/"])) is None
    assert origin_refusal(rewritten, trusted_origins(["https://dash.example.com:8443"])) is not None
    for bad in ("dash.example.com", "https://dash.example.com/path", "ftp://dash", "https://x:99999"):
        with pytest.raises(ConfigurationError, match="not an origin"):
            trusted_origins([bad])


# -- the Host allow-list -------------------------------------------------------------------------------------------


def test_the_host_allow_list() -> None:
    allowed = AllowedHosts(["127.0.0.1:8471", "localhost:8471", "[::1]:8471", "Dash.Example.com", "::2"])
    for host in ("127.0.0.1:8471", "LOCALHOST:8471", "[::1]:8471", "dash.example.com", "dash.example.com:443", "[::2]"):
        assert allowed.allows(host), host
    for host in (
        "127.0.0.1:8472",
        "127.0.0.1",
        "rebind.evil.example:8471",
        "evil.dash.example.com",
        "",
        "[::1",
        "a:b:c",
    ):
        assert not allowed.allows(host), host
    assert AllowedHosts(["*"]).allows("anything.at.all:1")
    for bad in ("http://x", "x:port", "x:99999", "user@x"):
        with pytest.raises(ConfigurationError, match="not a host name"):
            AllowedHosts([bad])
    assert split_host("[::1]:8471") == ("::1", 8471) and split_host("Name") == ("name", None)


# -- credentials ---------------------------------------------------------------------------------------------------


def test_credentials_come_from_the_environment_or_a_file(tmp_path: Path) -> None:
    password_file, token_file = tmp_path / "password", tmp_path / "token"
    password_file.write_text("pass word\n")
    token_file.write_text("tok-en\n")
    from_env = load_credentials("ops", None, None, {"DELAY_BROKER_WEB_PASSWORD": "pw", "DELAY_BROKER_WEB_TOKEN": "t"})
    assert (from_env.user, from_env.password, from_env.token) == ("ops", "pw", "t")
    from_files = load_credentials("admin", str(password_file), str(token_file), {})
    assert (from_files.password, from_files.token) == ("pass word", "tok-en")
    assert "pass word" not in repr(from_files) and "tok-en" not in repr(from_files)
    assert not load_credentials("admin", None, None, {}).required
    for environ, password, what in [
        ({"DELAY_BROKER_WEB_PASSWORD": "pw"}, str(password_file), "both DELAY_BROKER_WEB_PASSWORD and a password"),
        ({"DELAY_BROKER_WEB_TOKEN": " "}, None, "DELAY_BROKER_WEB_TOKEN is set but empty"),
        ({}, str(tmp_path / "missing"), "cannot read the password file"),
    ]:
        with pytest.raises(ConfigurationError, match=what):
            load_credentials("admin", password, None, environ)
    with pytest.raises(ConfigurationError, match="no colon"):
        load_credentials("a:b", None, None, {"DELAY_BROKER_WEB_PASSWORD": "pw"})


def test_credentials_are_checked_whole() -> None:
    credentials = load_credentials(
        "ops", None, None, {"DELAY_BROKER_WEB_PASSWORD": "pw", "DELAY_BROKER_WEB_TOKEN": "t"}
    )
    assert credentials.check_basic("ops", "pw")
    for user, password in (("ops", "pw "), ("ops", "p"), ("op", "pw"), ("", ""), ("ops", "PW")):
        assert not credentials.check_basic(user, password)
    assert credentials.check_token("t") and not credentials.check_token("t2") and not credentials.check_token("")
    only_token = load_credentials("ops", None, None, {"DELAY_BROKER_WEB_TOKEN": "t"})
    assert not only_token.check_basic("ops", "")


def test_the_backend_lets_through_only_the_right_credentials() -> None:
    backend = CredentialsBackend(load_credentials("ops", None, None, {"DELAY_BROKER_WEB_PASSWORD": "p:w"}))
    basic = base64.b64encode(b"ops:p:w").decode()
    _, user = asyncio.run(backend.authenticate(request({"authorization": f"Basic {basic}"})))
    assert user.identity == "ops"
    for header in ("", "Basic !!!", f"Basic {base64.b64encode(b'ops:pw').decode()}", "Bearer p:w", "Digest x"):
        with pytest.raises(AuthenticationError):
            asyncio.run(backend.authenticate(request({"authorization": header} if header else {})))


# -- what is loopback ----------------------------------------------------------------------------------------------


def test_loopback_wildcard_and_the_default_hosts() -> None:
    for host in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost", "LocalHost"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "192.168.1.10", "10.0.0.1", "no-such-host.invalid"):
        assert not is_loopback(host), host
    assert is_wildcard("0.0.0.0") and is_wildcard("::") and not is_wildcard("127.0.0.1")
    assert default_hosts("127.0.0.1", 8471) == ["127.0.0.1:8471", "localhost:8471", "[::1]:8471"]
    assert default_hosts("::1", 9) == ["[::1]:9", "127.0.0.1:9", "localhost:9"]
    assert default_hosts("192.168.1.10", 80) == ["192.168.1.10:80"]
    everywhere = default_hosts("0.0.0.0", 8471)
    assert everywhere[:3] == ["127.0.0.1:8471", "localhost:8471", "[::1]:8471"] and "0.0.0.0:8471" not in everywhere
    assert (display_host("0.0.0.0"), display_host("::"), display_host("::1")) == ("127.0.0.1", "[::1]", "[::1]")
