"""The store's Lua scripts, one ``.lua`` file each, loaded with the shared helpers of ``_lib.lua``."""

from __future__ import annotations

from functools import cache
from importlib import resources

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
)


def _read(filename: str) -> str:
    return resources.files(__name__).joinpath(filename).read_text(encoding="utf-8")


@cache
def source(name: str) -> str:
    """The text sent to Redis for script ``name``: the shared helpers, then the script itself."""
    if name not in NAMES:
        raise KeyError(f"no script named {name!r}")
    return _read("_lib.lua") + "\n" + _read(f"{name}.lua")
