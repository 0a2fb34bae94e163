"""Security: a least-privilege Redis ACL user, TLS, no unpickling or evaluation, crafted envelopes.

Each test prints what it checked; ``pytest -s`` shows it.
"""

from __future__ import annotations

import ast
import functools
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import delay_broker
from delay_broker import (
    DelayBrokerError,
    DelayStore,
    Envelope,
    ListTarget,
    ParkRequest,
    Promoter,
    RuntimeSchedules,
    StoreUnavailable,
)
from delay_broker.cron import CronScheduler
from delay_broker.deliverers import DirectLists, ListDeliverer
from delay_broker.embedded import EmbeddedRedis, free_port
from delay_broker.operations import MessageFilter, Operations
from tests.helpers import wait_for as shared_wait_for

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(delay_broker.__file__).resolve().parent


wait_for = functools.partial(shared_wait_for, timeout=15.0)


# -- (a) a Redis ACL user limited to the store's keys and the commands it needs ---------------------------------

CLIENT_COMMANDS = (
    "evalsha",  # every store operation is a script
    "script|load",  # redis-py loads a script the server does not have yet (first use, after a restart)
    "blpop",  # a sleeping promoter waits on the wake lists
    "lpush",  # Promoter.stop() wakes its own sleeper (and the scripts' wake marker, the lpush targets)
    "expire",  # ... whose stop marker expires by itself
    "get",  # the namespace's shard count, read once per store
    "set",  # ... and recorded by the first one that parks
    "zrem",  # a stopped promoter removes its heartbeat (also used inside scripts)
    "del",  # ... and its stop marker
    "ping",  # health checks of clients made by DelayStore.from_url (health_check_interval)
)
SCRIPT_COMMANDS = (
    "time",
    "type",
    "exists",
    "incrby",
    "zadd",
    "zscore",
    "zrange",
    "zrangebyscore",
    "zrank",  # a filtered listing goes on from where its last page stopped
    "zcount",
    "zcard",
    "zpopmin",
    "zremrangebyscore",
    "hset",
    "hget",
    "hmget",
    "hdel",
    "hexists",
    "hincrby",
    "hgetall",
    "rpush",  # targets in "rpush" and "hash" mode; packs
    "lrem",  # a wake token is kept once per shard
    "lindex",  # packs: a packed message read by id
    "lset",  # ... and taken out of its pack
    "lrange",  # ... listed, and opened
    "ltrim",  # ... its pack's head dropped once opened
    "llen",  # ... a pack's type checked before the first write
    "hlen",  # ... a partition of the packed index found full
)
"""Commands Redis runs for delay_broker: Redis checks a script's own calls against the ACL too."""

NEEDED = CLIENT_COMMANDS + SCRIPT_COMMANDS

FASTER_WITH = ("zremrangebyrank",)
"""In the documented line, not needed: promotion removes the due head by rank with it (Redis 7+ scripts check it
first), and looks each id up with ZREM under a line from before it was used."""


def acl_setuser_line(user: str, password: str, namespace: str, targets: list[str], commands: tuple[str, ...]) -> str:
    keys = " ".join(f"~{key}" for key in [f"delay_broker:{{{namespace}}}:*", *targets])
    allowed = " ".join(f"+{command}" for command in commands)
    return f"ACL SETUSER {user} reset on >{password} {keys} resetchannels -@all {allowed}"


def exercise(store: DelayStore, client: redis.Redis, targets: dict[str, ListTarget]) -> None:
    """Every operation of the store and of a promoter, including the rarer paths (lease expiry, retry,
    dead letters, requeue, purge, hash and rpush targets, waking, stopping)."""
    ready = Envelope(route="ready", payload=b"r")
    hashed = Envelope(route="hashed", payload=b"h", hash_field="field-1")
    store.park_many([ParkRequest(f"m{n}", ready, delay=0) for n in range(6)])
    store.park("far", ready, delay=600)
    store.park("far", ready, delay=500, on_conflict="keep")
    store.claim(2, lease=0.001, promoter_id="p")  # a lease that expires at once
    time.sleep(0.01)
    claim = store.claim(3, lease=30, promoter_id="p")  # gives the expired leases back, claims three
    assert len(claim.messages) == 3
    store.ack(claim.lease_deadline_ms, [claim.messages[0].id])
    store.nack(claim.lease_deadline_ms, [(claim.messages[1].id, "x", "retry"), (claim.messages[2].id, "x", "dead")])
    claim = store.claim(1, lease=30, promoter_id="p")
    store.nack(claim.lease_deadline_ms, [(claim.messages[0].id, "x", "release")])
    assert store.requeue_dead().count == 1
    store.park("h", hashed, delay=0)
    store.promote_direct(targets, 1000, "p")
    store.stats()
    store.list_messages("due")
    store.park("far-too", ready, delay=600)  # two parked whatever was promoted: the next page goes on by position
    page = Operations(store).find(MessageFilter(queue="ready"), limit=1)
    assert page.cursor is not None
    Operations(store).find(MessageFilter(queue="ready"), cursor=page.cursor, limit=1)
    assert store.get("far") is not None
    store.reschedule("far", delay=60)
    store.cancel("far")
    # Packed messages (due at least pack_after ahead, UUID ids), enough to split the packed index, then opened.
    packed = [str(uuid.UUID(int=n + 1, version=4)) for n in range(200)]
    store.park_many([ParkRequest(id, ready, delay=3600) for id in packed])
    store.park(packed[0], ready, delay=7200, on_conflict="keep")
    assert store.get(packed[1]) is not None
    store.reschedule(packed[2], delay=7200)
    store.cancel(packed[3])
    assert Operations(store).count(MessageFilter(queue="ready")).matched >= 196
    opener = DelayStore(client, namespace=store.keys.namespace, pack_after=86400 * 365)  # opens every pack now
    assert opener.open_packs(0) is None and store.stats().packed == 0
    store.park("doomed", ready, delay=0)
    claim = store.claim(10, lease=30, promoter_id="p")
    store.nack(claim.lease_deadline_ms, [(m.id, "x", "dead") for m in claim.messages])
    assert store.purge_dead() >= 1
    # Recurring schedules, stored at runtime and run by a scheduler.
    schedules = RuntimeSchedules(store)
    schedules.add("acl", "t", every=60)
    scheduler = CronScheduler(store, builder=lambda call: lambda id, due: Envelope(route="ready", payload=b"s"))
    assert scheduler.run_pending() == 1
    schedules.pause("acl")
    schedules.run_now("acl")
    time.sleep(0.6)  # past the scheduler's shortest wait between two reads of the schedules' revision
    assert scheduler.run_pending() == 1
    schedules.remove("acl")
    store.wait_for_wake(0.01, "p")
    store.wake("p")
    store.forget_promoter("p")
    client.ping()
    promoter = Promoter(store, DirectLists(targets), max_idle=0.3).start()
    try:
        store.park("late", Envelope(route="ready", payload=b"late"), delay=0.05)
        wait_for(lambda: promoter.counters.promoted >= 1, timeout=10)
    finally:
        promoter.stop()
    assert promoter.counters.errors == 0


@pytest.fixture
def acl_redis() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as server:
        yield server


def acl_targets() -> tuple[str, dict[str, ListTarget], list[str]]:
    """A namespace of its own, a list and a list+hash target outside it, and the target keys for the ACL."""
    namespace = f"acl-{uuid.uuid4().hex[:8]}"
    targets = {
        "ready": ListTarget(f"app:{namespace}:ready"),
        "hashed": ListTarget(f"app:{namespace}:q", mode="hash", hash_key=f"app:{namespace}:q.msgs"),
    }
    return namespace, targets, [f"app:{namespace}:ready", f"app:{namespace}:q", f"app:{namespace}:q.msgs"]


@pytest.mark.parametrize("line", ["documented", "without zremrangebyrank"])
def test_store_and_promoter_work_under_a_least_privilege_acl_user(acl_redis, line):
    admin = acl_redis.client()
    namespace, targets, target_keys = acl_targets()
    commands = NEEDED + FASTER_WITH if line == "documented" else NEEDED
    setuser = acl_setuser_line("delay_broker", "s3cret", namespace, target_keys, commands)
    print(f"\n{setuser}")
    admin.execute_command(*setuser.split())
    admin.acl_log_reset()
    admin.config_resetstat()
    user = redis.Redis(port=acl_redis.port, username="delay_broker", password="s3cret")
    store = DelayStore(user, namespace=namespace, retry_backoff=(0.01, 0.01), max_attempts=5)

    exercise(store, user, targets)

    denied = admin.acl_log(count=1000)
    assert denied == [], f"refused under the documented ACL: {denied}"
    assert admin.lrange(targets["ready"].list_key, 0, -1), "the promoter delivered under the ACL user"
    if int(admin.info("server")["redis_version"].split(".")[0]) >= 7:  # 6.2 scripts cannot check: ZREM there
        by_rank = admin.info("commandstats").get("cmdstat_zremrangebyrank", {}).get("calls", 0)
        assert (by_rank > 0) == (line == "documented"), f"ZREMRANGEBYRANK calls: {by_rank}"
    # The same through from_url (the CLI's way), with the credentials in the URL.
    url_store = DelayStore.from_url(f"redis://delay_broker:s3cret@127.0.0.1:{acl_redis.port}/0", namespace=namespace)
    assert url_store.stats().parked >= 0

    # Outside its key pattern and command list, the user is refused.
    with pytest.raises(redis.exceptions.NoPermissionError):
        user.get("someone-elses-key")
    with pytest.raises(redis.exceptions.NoPermissionError):
        user.flushall()
    with pytest.raises(redis.exceptions.NoPermissionError):
        user.execute_command("EVAL", "return redis.call('GET', KEYS[1])", 1, "someone-elses-key")
    foreign = DirectLists({"ready": ListTarget("someone-elses:queue")})
    store.park("stray", Envelope(route="ready", payload=b"x"), delay=0)
    with pytest.raises(DelayBrokerError, match=r"permission|can't run|no permissions"):
        store.promote_direct(foreign.direct_routes(), 10, "p")
    assert admin.exists("someone-elses:queue") == 0
    print(f"under the ACL user: all store operations and a promoter ran; {len(admin.acl_log())} refusals logged")


def test_every_command_of_the_acl_line_is_needed(acl_redis):
    """Minimality: with any one command taken out, some operation of the exercise is refused (by Redis as the
    command runs, or up front by a script that checks the commands it needs before it writes anything)."""
    admin = acl_redis.client()
    namespace, targets, target_keys = acl_targets()
    refused_by_omission: dict[str, str] = {}
    for omitted in NEEDED:
        checked_up_front: set[str] = set()
        admin.script_flush()
        admin.acl_log_reset()
        for key in admin.scan_iter(match=f"*{namespace}*"):
            admin.delete(key)
        commands = tuple(command for command in NEEDED if command != omitted)
        admin.execute_command(*acl_setuser_line("trial", "pw", namespace, target_keys, commands).split())
        user = redis.Redis(port=acl_redis.port, username="trial", password="pw")
        store = DelayStore(user, namespace=namespace, retry_backoff=(0.01, 0.01), max_attempts=5)
        try:
            exercise(store, user, targets)
        except Exception as error:
            refused_by_omission[omitted] = type(error).__name__
            checked_up_front.update(name.lower() for name in re.findall(r"may not run ([A-Z]+)", str(error)))
        finally:
            user.close()
        refused = {entry["object"] for entry in admin.acl_log(count=1000) if entry["reason"] == "command"}
        refused |= checked_up_front
        assert omitted in refused, f"{omitted!r} was not needed by any operation (refused: {refused})"
    print(f"each of the {len(NEEDED)} commands is needed: {sorted(refused_by_omission)}")


@pytest.mark.parametrize("path", ["exactly-once", "at-least-once"])
def test_a_promoter_short_of_any_one_command_loses_no_message(acl_redis, path):
    # Redis checks a script's redis.call against the ACL only as it runs, and a script refused half-way keeps
    # what it wrote: a claim refused its HSET after its ZPOPMIN, and each retry drained another batch.
    admin = acl_redis.client()
    if int(admin.info("server")["redis_version"].split(".")[0]) < 7:
        pytest.skip("Redis 6.2 has no redis.acl_check_cmd: a least-privilege user must grant every command")
    namespace, targets, target_keys = acl_targets()
    owner = DelayStore(admin, namespace=namespace)
    for omitted in SCRIPT_COMMANDS:  # those a script may meet after it wrote
        admin.execute_command(*acl_setuser_line("short", "pw", namespace, target_keys, NEEDED).split())
        admin.execute_command("ACL", "SETUSER", "short", f"-{omitted}")
        ids = [f"{omitted}-{n}" for n in range(20)]
        owner.park_many([ParkRequest(id, Envelope(route="ready", payload=id.encode()), delay=0) for id in ids])
        user = redis.Redis(port=acl_redis.port, username="short", password="pw")
        store = DelayStore(user, namespace=namespace, retry_backoff=(0.01, 0.01))
        deliverer = DirectLists(targets) if path == "exactly-once" else ListDeliverer(user, targets)
        promoter = Promoter(store, deliverer, batch=5, lease=30, max_idle=0.05)
        for _ in range(2):  # each step used to drain another batch
            promoter.step()
        user.close()
        delivered = {item.decode() for item in admin.lrange(targets["ready"].list_key, 0, -1)}
        kept = {info.id for state in ("due", "inflight", "dead") for info in owner.list_messages(state)}
        assert set(ids) <= delivered | kept, f"without {omitted}: lost {sorted(set(ids) - delivered - kept)}"
        assert all(owner.get(id) is not None for id in set(ids) - delivered), f"without {omitted}: no envelope"
        owner.cancel_many(ids)
        admin.delete(targets["ready"].list_key)


def test_a_promoter_stops_although_its_user_may_not_wake_it(acl_redis):
    admin = acl_redis.client()
    namespace, targets, target_keys = acl_targets()
    commands = tuple(command for command in NEEDED if command not in ("lpush", "expire"))
    admin.execute_command(*acl_setuser_line("nowake", "pw", namespace, target_keys, commands).split())
    user = redis.Redis(port=acl_redis.port, username="nowake", password="pw")
    promoter = Promoter(DelayStore(user, namespace=namespace), DirectLists(targets), max_idle=0.5).start()
    time.sleep(0.3)
    promoter.stop(timeout=5)  # the wake is refused: the promoter notices at the end of its sleep
    assert not promoter.running
    user.close()


# -- (b) TLS -------------------------------------------------------------------------------------------------


def make_certificates(directory: Path) -> dict[str, Path]:
    """A self-signed CA and a server certificate for 127.0.0.1 / localhost, made with the openssl tool."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("openssl is not installed (Debian: apt-get install openssl)")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=directory, check=True, capture_output=True)

    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *curve, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
        "-subj", "/CN=delay_broker test CA", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    run("req", *curve, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost")
    (directory / "server.ext").write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n"
    )
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.crt", "-days", "2", "-extfile", "server.ext")  # fmt: skip
    return {"ca": directory / "ca.crt", "cert": directory / "server.crt", "key": directory / "server.key"}


class TlsRedis(EmbeddedRedis):
    """A private redis-server that speaks TLS only (``--port 0``), with a certificate of our own CA."""

    def __init__(self, certificates: dict[str, Path]) -> None:
        port = free_port()
        self.ca = certificates["ca"]
        super().__init__(
            [
                "--port", "0",
                "--tls-port", str(port),
                "--tls-cert-file", str(certificates["cert"]),
                "--tls-key-file", str(certificates["key"]),
                "--tls-ca-cert-file", str(self.ca),
                "--tls-auth-clients", "no",
            ],
            port=port,
        )  # fmt: skip

    @property
    def url(self) -> str:
        return f"rediss://127.0.0.1:{self.port}/0"

    def client(self, **options: object) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1",
            port=self.port,
            ssl=True,
            ssl_ca_certs=str(self.ca),
            **options,  # type: ignore[arg-type]
        )


def test_park_and_promote_over_tls(tmp_path, unique):
    certificates = make_certificates(tmp_path)
    with TlsRedis(certificates) as server:
        admin = server.client()
        assert admin.ping()
        namespace, ready = f"tls-{unique}", f"tls-{unique}:ready"

        # Without TLS, or without trusting the CA, nothing gets through.
        with pytest.raises(StoreUnavailable):
            DelayStore(redis.Redis(port=server.port, socket_timeout=2), namespace=namespace).stats()
        with pytest.raises(StoreUnavailable, match="certificate verify failed"):
            DelayStore.from_url(server.url, namespace=namespace).stats()

        # A producer and an in-process promoter through from_url with ssl_ca_certs ...
        store = DelayStore.from_url(server.url, namespace=namespace, ssl_ca_certs=str(certificates["ca"]))
        store.park_many([ParkRequest(f"t{n}", Envelope(route="ready", payload=f"t{n}".encode()), delay=0.2)
                         for n in range(50)])  # fmt: skip
        promoter = Promoter(store, DirectLists({"ready": ListTarget(ready, mode="rpush")}), max_idle=0.5).start()
        try:
            wait_for(lambda: admin.llen(ready) == 50)
        finally:
            promoter.stop()

        # ... and a promoter process given a rediss:// URL with the CA in its query string.
        store.park_many([ParkRequest(f"u{n}", Envelope(route="ready", payload=f"u{n}".encode()), delay=0.1)
                         for n in range(50)])  # fmt: skip
        url = f"{server.url}?ssl_ca_certs={certificates['ca']}"
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.promoter_process", url, namespace, ready],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert process.stdout is not None and process.stdout.readline().strip() == "ready"
            wait_for(lambda: admin.llen(ready) == 100)
        finally:
            process.terminate()
            process.wait(15)
        delivered = sorted(item.decode() for item in admin.lrange(ready, 0, -1))
        stats = store.stats()
    print(f"TLS: delivered {len(delivered)}, duplicated {len(delivered) - len(set(delivered))}, left {stats.parked}")
    assert delivered == sorted([f"t{n}" for n in range(50)] + [f"u{n}" for n in range(50)])
    assert (stats.parked, stats.inflight, stats.dead) == (0, 0, 0)


# -- (c) nothing read from Redis is unpickled or evaluated -------------------------------------------------------

UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle", "jsonpickle"}
UNSAFE_CALLS = {"eval", "exec", "compile", "__import__"}
UNSAFE_ATTRIBUTES = {("yaml", "load"), ("yaml", "unsafe_load"), ("yaml", "full_load"), ("yaml", "load_all")}


def python_sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def unsafe_uses(path: Path) -> list[str]:
    """Uses in code (not in comments, strings or docstrings) of deserialisers or evaluators that can run code."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[str] = []
    kombu_loads: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name.split(".")[0] in UNSAFE_MODULES]
        elif isinstance(node, ast.ImportFrom):
            module = (node.module or "").split(".")[0]
            if module in UNSAFE_MODULES:
                found.append(f"from {node.module} import ...")
            if node.module == "kombu.serialization":
                kombu_loads |= {a.asname or a.name for a in node.names if a.name == "loads"}
        elif isinstance(node, ast.Name) and node.id in UNSAFE_MODULES:
            found.append(f"name {node.id}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in UNSAFE_CALLS:
            found.append(f"call {node.func.id}()")
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and (node.value.id, node.attr) in UNSAFE_ATTRIBUTES
        ):
            found.append(f"{node.value.id}.{node.attr}")
    # kombu's loads() decodes pickle unless told which content types to accept: every use must say.
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.AnnAssign | ast.Assign)
            and isinstance(node.value, ast.Name)
            and node.value.id in kombu_loads
        ):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            kombu_loads |= {t.id for t in targets if isinstance(t, ast.Name)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in kombu_loads:
            accept = [k for k in node.keywords if k.arg == "accept"]
            if not accept or (isinstance(accept[0].value, ast.Constant) and accept[0].value.value is None):
                found.append(f"kombu loads() without accept= (line {node.lineno})")
    return found


def test_no_pickle_or_eval_of_stored_data():
    sources = python_sources()
    assert len(sources) > 10
    problems = {str(path.relative_to(PACKAGE)): uses for path in sources if (uses := unsafe_uses(path))}
    lua = sorted((PACKAGE / "scripts").glob("*.lua"))
    for path in lua:
        code = "\n".join(line.split("--", 1)[0] for line in path.read_text().splitlines())
        if hits := re.findall(r"\b(loadstring|loadfile|dofile|load)\s*\(", code):
            problems[str(path.relative_to(PACKAGE))] = hits
    print(f"scanned {len(sources)} Python files and {len(lua)} Lua scripts: {len(problems)} with unsafe uses")
    assert problems == {}


def test_the_scanner_finds_what_it_looks_for(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""pickle and eval( in a docstring are fine."""\n'
        "# import pickle  (a comment is fine too)\n"
        "import pickle\n"
        "from kombu.serialization import loads as decode\n"
        "value = eval('1')\n"
        "data = pickle.loads(b'')\n"
        "decode(b'', 'application/json', 'utf-8')\n"
        "decode(b'', 'application/json', 'utf-8', accept={'application/json'})\n"
    )
    assert unsafe_uses(sample) == [
        "import pickle",
        "call eval()",
        "name pickle",
        "kombu loads() without accept= (line 7)",
    ]


# -- (d) a crafted envelope reaches no queue the application did not declare ----------------------------------------


CRAFTED = {
    "undeclared-route": b'{"v":1,"f":"raw","r":"evil"}\nrm -rf',
    "route-is-a-key-name": None,  # filled in with the declared list's key name below
    "route-is-not-a-string": b'{"v":1,"f":"raw","r":{"ready":1}}\nx',
    "route-is-a-number": b'{"v":1,"f":"raw","r":5}\nx',
    "lua-metafield-route": b'{"v":1,"f":"raw","r":"__index"}\nx',
    "no-route": b'{"v":1,"f":"raw"}\nx',
}


@pytest.mark.parametrize("path", ["exactly-once", "at-least-once"])
def test_crafted_envelopes_are_dead_lettered_and_published_nowhere(redis_server, unique, path):
    client = redis_server.client()
    namespace, ready = f"crafted-{unique}", f"crafted-{unique}:ready"
    store = DelayStore(client, namespace=namespace)
    crafted = dict(CRAFTED)
    crafted["route-is-a-key-name"] = b'{"v":1,"f":"raw","r":"' + ready.encode() + b'"}\nx'
    before = set(client.keys("*"))
    score = int(client.time()[0]) * 1000 * 1024
    for id, raw in crafted.items():
        assert raw is not None
        client.hset(store.keys.msg, id, raw)
        client.zadd(store.keys.due, {id: score})
    store.park("good", Envelope(route="ready", payload=b"good"), delay=0)
    targets = {"ready": ListTarget(ready)}
    deliverer = DirectLists(targets) if path == "exactly-once" else ListDeliverer(client, targets)
    promoter = Promoter(store, deliverer, max_idle=0.2).start()
    try:
        wait_for(lambda: store.stats().dead == len(crafted) and client.llen(ready) == 1)
    finally:
        promoter.stop()
    reasons = {info.id: info.error or "" for info in store.list_messages("dead")}
    new_keys = {key.decode() for key in set(client.keys("*")) - before}
    strays = {key for key in new_keys if not key.startswith(f"delay_broker:{{{namespace}}}:") and key != ready}
    print(f"{path}: {len(crafted)} crafted envelopes dead-lettered, 1 good delivered, stray keys: {sorted(strays)}")
    assert client.lrange(ready, 0, -1) == [b"good"]
    assert strays == set(), "a crafted envelope made the promoter write outside the store and the declared queue"
    for id in crafted:
        assert "unknown route" in reasons[id] or "no route" in reasons[id], (id, reasons[id])
    assert promoter.counters.errors == 0
