"""A worker pays for what it uses: installing the Dramatiq middleware or the Celery transport loads none of the
heavy libraries of the other extras (every worker process paid 16 MB for boto3 and pika it did not use)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("click", "rich", "jinja2", "starlette", "uvicorn", "prometheus_client", "opentelemetry", "psycopg",
         "boto3", "botocore", "pika", "croniter", "dramatiq_sqs")  # fmt: skip

DRAMATIQ = """
import dramatiq
from dramatiq.brokers.redis import RedisBroker
broker = RedisBroker(url="redis://127.0.0.1:1/0")
dramatiq.set_broker(broker)
@dramatiq.actor
def task(x): pass
{install}
"""

CELERY = """
from celery import Celery
app = Celery("weight", broker="redis://127.0.0.1:1/0")
{install}
with app.connection_for_write() as connection:
    connection.transport
"""


def loaded(program: str) -> set[str]:
    code = program + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    return set(
        json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    )


def added_heavy(program: str, install: str) -> list[str]:
    added = loaded(program.format(install=install)) - loaded(program.format(install=""))
    return sorted(name for name in added if name.split(".")[0] in HEAVY)


def test_the_dramatiq_middleware_loads_no_other_extra() -> None:
    install = "from delay_broker.dramatiq import DelayMiddleware\nbroker.add_middleware(DelayMiddleware())"
    assert added_heavy(DRAMATIQ, install) == []


def test_the_celery_transport_loads_no_other_extra() -> None:
    install = "import delay_broker.celery\ndelay_broker.celery.install(app)"
    assert added_heavy(CELERY, install) == []
