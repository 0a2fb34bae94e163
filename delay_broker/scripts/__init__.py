"""The store's Lua scripts, one ``.lua`` file each, loaded with the key names and shared helpers they use.

Each script is sent as: the prelude naming the keys of a shard it uses (those it names, in the order of
:data:`delay_broker.keys.SCRIPT_KEYS`, so the order is written down once), for a script that checks its
permissions the commands it calls, the helpers of ``_lib/`` it calls, then the script itself. Only the keys
and helpers a script's code uses (and those they use; names in comments do not count) are sent: Redis creates
every key and runs the whole text at every call, and defining every helper each time cost a park about 4 us of
server time.

The helpers are grouped by area in ``_lib/``, in :data:`LIB` order (a helper is defined after those it calls):
due times, guards, envelopes, promotion, packs, the by-id scripts' arguments, parking, repairs.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

from ..keys import SCRIPT_KEYS, lua_key_names

NAMES = (
    "park",
    "park_occurrence",
    "adopt",
    "park_one",
    "pack_one",
    "claim",
    "ack",
    "renew",
    "nack",
    "promote_list",
    "cancel",
    "reschedule",
    "get",
    "list",
    "stats",
    "requeue",
    "purge",
    "trim_dead",
    "schedule_update",
    "find",
    "memory_policy",
    "open_pack",
    "find_packed",
    "split_index",
    "held",
    "pack_audit",
    "repair_shape",
    "repair_entry",
    "repair_record",
    "repair_pack",
    "rehome_take",
    "rehome",
    "layout",
)


LIB = ("time", "guards", "envelope", "promotion", "packs", "by_id", "parking", "repair")
"""The helper files of ``_lib/``, in the order their definitions are sent."""


def _read(filename: str) -> str:
    return resources.files(__name__).joinpath(filename).read_text(encoding="utf-8")


def code_of(text: str) -> str:
    """Lua ``text`` without its comments (``--`` outside strings, to the end of the line), which name keys and
    helpers a script does not use."""
    out: list[str] = []
    quote = ""
    i, size = 0, len(text)
    while i < size:
        char = text[i]
        if quote:
            out.append(char)
            if char == "\\" and i + 1 < size:
                out.append(text[i + 1])
                i += 1
            elif char == quote or char == "\n":
                quote = ""
        elif char in "'\"":
            quote = char
            out.append(char)
        elif text.startswith("--", i):
            end = text.find("\n", i)
            i = size if end < 0 else end
            continue
        else:
            out.append(char)
        i += 1
    return "".join(out)


@cache
def source(name: str) -> str:
    """The text sent to Redis for script ``name``: key names, shared helpers, then the script itself."""
    body = _read(f"{name}.lua")
    helpers = "".join(_helpers_used_by(body))
    return lua_key_names(keys_used(name)) + _commands_line(helpers + body) + helpers + "\n" + body


@cache
def keys_used(name: str) -> frozenset[str]:
    """The keys of :data:`~delay_broker.keys.SCRIPT_KEYS` script ``name`` names (``DUE`` ...) outside its
    comments: the ones it receives (helpers take the keys they touch as arguments); ``due`` for a script that
    names none, so that the call still goes to the shard's node."""
    if name not in NAMES:
        raise KeyError(f"no script named {name!r}")
    words = set(re.findall(r"\w+", code_of(_read(f"{name}.lua"))))
    # One at least: a script that touches none (memory_policy) still goes to the shard's node of a Cluster.
    return frozenset(key for key in SCRIPT_KEYS if key.upper() in words) or frozenset({SCRIPT_KEYS[0]})


_COMMAND_CALL = re.compile(r"redis\.p?call\('([A-Z]+)'")


def _commands_line(text: str) -> str:
    """``SCRIPT_COMMANDS``, the commands a script (with its helpers) may call, for ``denied_command`` in
    ``_lib.lua``; only for scripts that use it: building the table costs every call."""
    if "denied_command" not in re.findall(r"\w+", code_of(text)):
        return ""
    commands = sorted(set(_COMMAND_CALL.findall(code_of(text))))
    return "local SCRIPT_COMMANDS = {" + ", ".join(f"'{command}'" for command in commands) + "}\n"


_NAME = re.compile(r"(?<![.:\w])[A-Za-z_]\w*")
"""A name a piece of code uses: not a field (``string.find`` uses ``string`` only)."""

_DEFINITION = re.compile(r"^local (?:function (\w+)|([\w, ]+?) =)", re.MULTILINE)


@cache
def _helper_sections() -> tuple[tuple[frozenset[str], str], ...]:
    """The helpers cut into their top-level definitions, each with the comment above it and the names it defines."""
    text = "\n".join(_read(f"_lib/{name}.lua") for name in LIB)
    starts = [match.start() for match in _DEFINITION.finditer(text)]
    sections = []
    for start, end in zip(starts, [*starts[1:], len(text)], strict=True):
        match = _DEFINITION.match(text, start)
        assert match is not None
        names = match.group(1) or match.group(2)
        if match.group(1):  # a function runs to its own top-level end (what follows is the next one's comment)
            block = text[start:end].rpartition("\nend\n")[0] + "\nend\n"
        else:  # a constant runs to the next blank line
            block = text[start:end].split("\n\n", 1)[0] + "\n"
        sections.append((frozenset(n.strip() for n in names.split(",")), block))
    return tuple(sections)


def _helpers_used_by(body: str) -> list[str]:
    """The helper sections whose names ``body``'s code calls, directly or through other helpers, in :data:`LIB`
    order."""
    sections = _helper_sections()
    wanted: set[int] = set()
    pending = [body]
    while pending:
        words = set(_NAME.findall(code_of(pending.pop())))
        for index, (names, block) in enumerate(sections):
            if index not in wanted and names & words:
                wanted.add(index)
                pending.append(block)
    return [sections[index][1] for index in sorted(wanted)]
