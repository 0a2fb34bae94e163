"""Pure units: Lua script headers, the score encoding shared with Lua, and the envelope format."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from delay_broker import CorruptEnvelope, Envelope, InvalidMessage
from delay_broker import scripts as script_package
from delay_broker.clock import FIFO_SLOTS, MAX_DUE_MS
from delay_broker.keys import SCRIPT_KEYS, lua_key_names


def lua_files() -> list[str]:
    return sorted(p.name for p in resources.files(script_package).iterdir() if p.name.endswith(".lua"))


@pytest.mark.parametrize("name", lua_files())
def test_every_script_documents_keys_and_argv_in_its_header(name):
    text = resources.files(script_package).joinpath(name).read_text()
    header = "\n".join(line for line in text.splitlines()[:40] if line.startswith("--"))
    assert header.startswith(f"-- {name}:"), "the header names the script and what it does"
    assert "-- KEYS:" in header and ("ARGV[1" in header or "-- ARGV: none" in header)
    assert name.removesuffix(".lua") in script_package.NAMES
    used = set(re.findall(r"\b([A-Z]+)\b", "\n".join(line for line in text.splitlines() if not line.startswith("--"))))
    documented = set(re.findall(r"^--\s+([A-Z]+)\s", header, flags=re.MULTILINE))
    keys = {key.upper() for key in SCRIPT_KEYS}
    assert used & keys <= documented, "the header documents every key the script uses"


def test_scripts_name_their_keys_instead_of_counting_them():
    # One key order, defined once in keys.SCRIPT_KEYS: scripts say DUE, not KEYS[1] (extra keys excepted).
    for name in lua_files():
        text = resources.files(script_package).joinpath(name).read_text()
        code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))
        assert not re.search(r"KEYS\[\d", code), name
    prelude = lua_key_names()
    for n, key in enumerate(SCRIPT_KEYS, start=1):
        assert f"local {key.upper()} = KEYS[{n}]" in prelude
    # Each script receives the keys it names, in that one order.
    assert script_package.source("renew").startswith("local INFLIGHT = KEYS[1]\nlocal FIRST_EXTRA_KEY = 2")
    used = script_package.keys_used("park")
    assert {"due", "msg", "packs"} <= used and "promoters" not in used
    assert script_package.source("park").startswith(lua_key_names(used))


def test_no_script_builds_key_names_itself():
    # Every key a script touches comes from KEYS (Redis Cluster needs it); none is spelled in Lua.
    for name in lua_files():
        text = resources.files(script_package).joinpath(name).read_text()
        code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))
        assert not re.search(r"['\"]delay_broker:\S*[:{]", code) and ":due'" not in code


def test_fifo_slots_agree_with_lua():
    lib = resources.files(script_package).joinpath("_lib/time.lua").read_text()
    assert re.search(r"local FIFO_SLOTS = (\d+)", lib).group(1) == str(FIFO_SLOTS)
    assert re.search(r"local MAX_DUE_MS = (\d+)", lib).group(1) == str(MAX_DUE_MS)
    assert (MAX_DUE_MS + 1) * FIFO_SLOTS <= 2**53, "scores stay exact as doubles"


UUID_TEXT = "0b6c9a3e-58f4-4f0e-9a61-2d8e5b7c1a90"


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize(
    "envelope",
    [
        Envelope(
            route="default",
            payload=bytes(range(256)) + b"\n\n{not json",
            framework="dramatiq",
            name="send",
            hash_field="abc",
            parked_at_ms=5,
        ),
        Envelope(route="q", payload=b"", framework="dramatiq", name="é", hash_field=UUID_TEXT, parked_at_ms=2**47),
        Envelope(route="amqp/celery", payload=b"\x02", framework="celery", extra={"exchange": "", "otel": {"a": "b"}}),
        Envelope(route="r", payload=b"p", hash_field=UUID_TEXT.upper()),
    ],
)
def test_envelope_round_trip_keeps_payload_bytes_opaque(envelope, version):
    assert Envelope.decode(envelope.encode(version=version)) == envelope


def test_extras_that_compare_equal_but_encode_apart_are_never_confused():
    # Text extras (a Celery task's queue) are encoded once and reused: 1 == True == 1.0 must not share that.
    for value in ("q", 1, True, 1.0, "1", "q"):
        read = Envelope.decode(Envelope(route="r", payload=b"p", extra={"k": value}).encode()).extra["k"]
        assert read == value and type(read) is type(value)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"no newline at all", "no header line"),
        (b"{broken\npayload", "not JSON"),
        (b"[1, 2]\npayload", "not a JSON object"),
        (b'{"v": 2, "f": "raw", "r": "q"}\n', "unsupported envelope version 2"),
        (b'{"v": 1, "f": "raw"}\n', "no route"),
        (b'{"v": 1, "f": "raw", "r": ""}\n', "no route"),
        (b'{"v": 1, "r": "q"}\n', "no framework"),
        (b'{"v": 1, "f": "raw", "r": "q", "h": 5}\n', "hash field"),
        (b'{"v": 1, "f": "raw", "r": "q", "x": [1]}\n', "extras"),
        (b'{"v": 1, "f": "raw", "r": "q", "t": "yesterday"}\n', "parked-at"),
        (b'{"v": 1, "f": "raw", "r": "q", "t": 1.5}\n', "parked-at"),
        (b"\xff\xfe\n", "not JSON"),
        # Read as the scripts read them: JSON is true, not 1, and UTF-8 only.
        (b'{"v": true, "f": "raw", "r": "q"}\n', "unsupported envelope version True"),
        (b'\xef\xbb\xbf{"v": 1, "f": "raw", "r": "q"}\n', "not JSON"),
        ('{"v": 1, "f": "raw", "r": "q"}\n'.encode("utf-16"), "not JSON"),
    ],
)
def test_corrupt_envelopes_are_refused_with_the_reason(raw, message):
    with pytest.raises(CorruptEnvelope, match=message):
        Envelope.decode(raw)


def test_the_binary_header_is_compact_and_keeps_a_uuid_hash_field_in_16_bytes():
    envelope = Envelope(route="default", payload=b"", framework="dramatiq", name="send_welcome",
                        hash_field=UUID_TEXT, parked_at_ms=1_800_000_000_000)  # fmt: skip
    compact, json_header = envelope.encode(), envelope.encode(version=1)
    assert compact[0] == 2 and json_header[:1] == b"{"
    assert len(compact) == 8 + 1 + 8 + 2 + 7 + 2 + 12 + 16, "marker, flags, time; framework, route, name; uuid"
    assert len(compact) < len(json_header) / 2
    assert Envelope.decode(compact).hash_field == UUID_TEXT


UTF16_EXTRAS = len('{"a":1}'.encode("utf-16")).to_bytes(4, "big") + '{"a":1}'.encode("utf-16")
GOOD_V2 = Envelope(route="q", payload=b"payload", name="n", hash_field="h", extra={"k": 1}).encode()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\x02\x00", "truncated header"),
        (b"\x02\x00\x00\x00\x00\x00\x00\x00\x05raw", "truncated header, in its framework"),
        (b"\x02\x00\x00\x00\x00\x00\x00\x00\x03raw\x00\x00", "no route"),
        (b"\x02\x00\x00\x00\x00\x00\x00\x00\x03raw\x00\x05q", "truncated header, in its route"),
        (b"\x02\x40" + GOOD_V2[2:], "unknown flags"),
        (b"\x02\x06\x00\x00\x00\x00\x00\x00\x03raw\x00\x01q\x01\x02", "truncated header, in its hash field"),
        (b"\x02\x01\x00\x00\x00\x00\x00\x00\x03raw\x00\x01q\x00\x02\xff\xfe", "name is not UTF-8"),
        (b"\x02\x08\x00\x00\x00\x00\x00\x00\x03raw\x00\x01q\x00\x00\x00\x02[]", "extras are not an object"),
        (b"\x02\x08\x00\x00\x00\x00\x00\x00\x03raw\x00\x01q\x00\x00\x00\x02{x", "extras are not JSON"),
        (GOOD_V2[:-12], "truncated header, in its extras"),
        (b"\x02\x08" + bytes(6) + b"\x03raw\x00\x01q" + UTF16_EXTRAS, "extras are not JSON"),
    ],
)
def test_corrupt_binary_envelopes_are_refused_with_the_reason(raw, message):
    with pytest.raises(CorruptEnvelope, match=message):
        Envelope.decode(raw)


def test_unencodable_fields_are_refused_clearly():
    with pytest.raises(InvalidMessage, match="route is 70000 bytes long"):
        Envelope(route="r" * 70_000, payload=b"").encode()
    with pytest.raises(ValueError, match="version must be 1 or 2"):
        Envelope(route="r", payload=b"").encode(version=3)


def test_each_script_carries_only_the_helpers_it_uses():
    assert "local function open_binary" in script_package.source("find"), "open_envelope needs it"
    assert "local function open_envelope" not in script_package.source("cancel")
    assert script_package.source("cancel").count("local function wrong_type") == 1
