"""The ``delay-broker`` command with every command group attached (click + rich)."""

from __future__ import annotations

from . import actions, check, cron, dead, demo, imports, inspect, serve, web
from .group import cli

for module in (inspect, actions, dead, cron, check, web, serve, imports, demo):
    for command in module.COMMANDS:
        cli.add_command(command)

__all__ = ["cli"]
