"""The ``delay-broker`` click group; :mod:`delay_broker.cli.app` attaches every command to it."""

from __future__ import annotations

import click

from .common import OrderedGroup


@click.group(cls=OrderedGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="delay-broker", prog_name="delay-broker")
def cli() -> None:
    """Inspect and operate the delayed Dramatiq and Celery messages that delay_broker parks in Redis.

    \b
    Common tasks:
      delay-broker stats                     how many are parked, overdue, in flight, dead; promoters alive
      delay-broker ls                        parked messages by due time (ls inflight, ls dead)
      delay-broker show ID                   one message, its payload decoded
      delay-broker reschedule ID --in 10m    move a parked message (or --at ISO-TIME, or --now)
      delay-broker cancel ID                 delete a parked message
      delay-broker dead ls                   dead-lettered messages and why they died
      delay-broker dead requeue ID|--all     send dead-lettered messages again
      delay-broker ls --task send_email --text acme    filters: --queue, --task, --id-prefix, --text
      delay-broker cancel --queue emails --to 1d       bulk forms of cancel, reschedule, dead requeue/purge
      delay-broker cron ls                   recurring schedules (cron add / pause / resume / run-now ...)
      delay-broker web                       the dashboard, on http://127.0.0.1:8471/
      delay-broker promote --dramatiq myapp.broker:broker --metrics-port 9871
      delay-broker metrics --port 9871       Prometheus endpoint for the backlog

    Commands that read the store take --redis-url (or DELAY_BROKER_REDIS_URL) and --namespace (or
    DELAY_BROKER_NAMESPACE; default "default", which Dramatiq apps use; Celery apps use "celery"), and print
    JSON instead of tables with --json. Times are UTC;
    "due in" and "overdue" are measured by the Redis server's clock. Run "delay-broker COMMAND --help" for
    the options of a command.
    """
