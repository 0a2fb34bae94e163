"""The store's Lua scripts, one ``.lua`` file each, loaded with the key names and shared helpers they use.

Each script is sent as: the prelude naming the keys of a shard it uses (those it names, in the order of
:data:`delay_broker.keys.SCRIPT_KEYS`, so the order is written down once), for a script that checks its
permissions the commands it calls, the helpers of ``_lib.lua`` it uses, then the script itself. Only the keys
and helpers a script uses (and those they use) are sent: Redis creates every key and runs the whole text at
every call, and defining every helper each time cost a park about 4 us of server time.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

from ..keys import SCRIPT_KEYS, lua_key_names

NAMES = (
    "park",
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
)


def _read(filename: str) -> str:
    return resources.files(__name__).joinpath(filename).read_text(encoding="utf-8")


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
    code = "\n".join(line for line in _read(f"{name}.lua").splitlines() if not line.lstrip().startswith("--"))
    words = set(re.findall(r"\w+", code))
    # One at least: a script that touches none (memory_policy) still goes to the shard's node of a Cluster.
    return frozenset(key for key in SCRIPT_KEYS if key.upper() in words) or frozenset({SCRIPT_KEYS[0]})


_COMMAND_CALL = re.compile(r"redis\.p?call\('([A-Z]+)'")


def _commands_line(text: str) -> str:
    """``SCRIPT_COMMANDS``, the commands a script (with its helpers) may call, for ``denied_command`` in
    ``_lib.lua``; only for scripts that use it: building the table costs every call."""
    if "denied_command" not in re.findall(r"\w+", text):
        return ""
    commands = sorted(set(_COMMAND_CALL.findall(text)))
    return "local SCRIPT_COMMANDS = {" + ", ".join(f"'{command}'" for command in commands) + "}\n"


_DEFINITION = re.compile(r"^local (?:function (\w+)|([\w, ]+?) =)", re.MULTILINE)


@cache
def _helper_sections() -> tuple[tuple[frozenset[str], str], ...]:
    """``_lib.lua`` cut into its top-level definitions, each with the comment above it and the names it defines."""
    text = _read("_lib.lua")
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
    """The sections of ``_lib.lua`` that ``body`` refers to, directly or through other helpers, in file order."""
    sections = _helper_sections()
    wanted: set[int] = set()
    pending = [body]
    while pending:
        words = set(re.findall(r"\w+", pending.pop()))
        for index, (names, block) in enumerate(sections):
            if index not in wanted and names & words:
                wanted.add(index)
                pending.append(block)
    return [sections[index][1] for index in sorted(wanted)]
