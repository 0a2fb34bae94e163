"""The store's Lua scripts, one ``.lua`` file each, loaded with the key names and shared helpers they use.

Each script is sent as: the prelude naming a shard's keys (generated from :data:`delay_broker.keys.SCRIPT_KEYS`,
so the key order is written down once), the helpers of ``_lib.lua``, then the script itself.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from ..keys import lua_key_names

NAMES = (
    "park",
    "claim",
    "ack",
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
)


def _read(filename: str) -> str:
    return resources.files(__name__).joinpath(filename).read_text(encoding="utf-8")


@cache
def source(name: str) -> str:
    """The text sent to Redis for script ``name``: key names, shared helpers, then the script itself."""
    if name not in NAMES:
        raise KeyError(f"no script named {name!r}")
    return lua_key_names() + _read("_lib.lua") + "\n" + _read(f"{name}.lua")
