"""Helpers of the dashboard's tests (tests/test_web_cli.py, integration/test_dashboard_security.py): a real
``delay-broker web`` process, and HTTP requests that report the status instead of raising."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request
from typing import Any

DASHBOARD_ENV = [name for name in os.environ if name.startswith("DELAY_BROKER_WEB_")]
"""Variables of the environment the tests run in that would change what a dashboard they start asks for."""


class WebCommand:
    """``delay-broker web --port 0 ARGS`` in a process of its own. It prints its URL once it serves: the
    constructor returns then, with ``url`` (no trailing slash) and ``first_line``."""

    def __init__(self, redis_url: str, namespace: str, *args: str, env: dict[str, str] | None = None) -> None:
        environment = {name: value for name, value in os.environ.items() if name not in DASHBOARD_ENV}
        environment.update({"DELAY_BROKER_REDIS_URL": redis_url, "DELAY_BROKER_NAMESPACE": namespace, **(env or {})})
        command = [sys.executable, "-m", "delay_broker", "web", "--port", "0", *args]
        self.process = subprocess.Popen(
            command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        self.first_line = self.process.stdout.readline()
        assert "http://" in self.first_line, self.stop()
        self.url = self.first_line.split(": ", 1)[1].split()[0].rstrip("/")
        self.port = int(self.url.rsplit(":", 1)[1])

    def stop(self) -> str:
        """Stop the server (if it still runs); its startup log (stderr)."""
        if self.process.poll() is None:
            self.process.terminate()
        _, log = self.process.communicate(timeout=15)
        return str(log)


def request(url: str, data: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, Any, str]:
    """Status, headers and body text of a GET (or a POST of ``data``), whatever the status."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data, headers or {}), timeout=10) as response:
            return int(response.status), response.headers, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read().decode()


def get(url: str, headers: dict[str, str] | None = None) -> int:
    return request(url, headers=headers)[0]
