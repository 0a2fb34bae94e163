"""The ``delay-broker`` command: entry point and the helpers that do not need the ``cli`` extra.

The commands are in the modules of this package, one per command group (they need click and rich):
:mod:`.common` (the options every command shares), :mod:`.inspect` (stats, ls, show), :mod:`.actions`
(cancel, reschedule), :mod:`.dead`, :mod:`.cron`, :mod:`.serve` (promote, metrics), :mod:`.demo`; :mod:`.app`
attaches them to the group. This module imports without click. The process helpers (:func:`run_until_signalled`
and its friends) live in :mod:`delay_broker.running`, which the Celery adapter's ``celery delay-broker`` command
uses too; they are re-exported here.
"""

from __future__ import annotations

import sys

from ..running import LOG_FORMAT, configure_logging, import_object, on_stop_signals, run_until_signalled

try:
    import click
    import rich  # noqa: F401  (only checked for here; the command modules use it)
except ImportError:  # pragma: no cover - depends on the install
    click = None  # type: ignore[assignment]


def main() -> None:
    if click is None:
        sys.exit("delay-broker: the command needs the 'cli' extra: pip install 'delay-broker[cli]'")
    from .app import cli

    cli()


if click is not None:
    # Re-exported: ``delay_broker.cli.cli`` is the click group.
    from .app import cli

__all__ = [
    "LOG_FORMAT",
    "cli",
    "configure_logging",
    "import_object",
    "main",
    "on_stop_signals",
    "run_until_signalled",
]
