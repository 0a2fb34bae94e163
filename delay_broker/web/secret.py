"""The server secret that signs the dashboard's session cookies and form tokens.

Given to :func:`delay_broker.web.create_app` (``secret=``), or read from ``DELAY_BROKER_WEB_SECRET``; without
either, one is generated for the process. Every process serving the same dashboard (uvicorn or gunicorn workers
behind one address) needs the same secret, or a form shown by one is refused by another.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigurationError

SECRET_ENV = "DELAY_BROKER_WEB_SECRET"
MIN_LENGTH = 16
"""Characters a given secret must have at least (``secrets.token_urlsafe(32)`` makes 43)."""

GENERATED = "generated for this process"

logger = logging.getLogger("delay_broker.web")


@dataclass(frozen=True)
class Secret:
    """A signing key and where it came from (for the startup log: never the key itself).

    Parameters:
      key: the bytes HMACs are keyed with.
      source: "given", "from DELAY_BROKER_WEB_SECRET", "from FILE" or "generated for this process".
    """

    key: bytes = field(repr=False)
    source: str

    @property
    def generated(self) -> bool:
        return self.source == GENERATED


def resolve_secret(secret: str | bytes | Secret | None = None, *, warn: bool = True) -> Secret:
    """The secret to sign with: ``secret`` if given, else ``DELAY_BROKER_WEB_SECRET``, else a fresh random one
    (logged as a warning unless ``warn`` is false: the caller says so itself). A given secret shorter than
    16 characters is refused with :class:`~delay_broker.errors.ConfigurationError`."""
    if isinstance(secret, Secret):
        return secret
    if secret is not None:
        return Secret(_key(secret, "secret="), "given")
    from_env = os.environ.get(SECRET_ENV)
    if from_env:
        return Secret(_key(from_env, SECRET_ENV), f"from {SECRET_ENV}")
    if warn:
        logger.warning(
            "delay_broker dashboard: no secret given (secret= or %s): one was generated for this process. "
            "Forms shown by another process (another worker, or before a restart) will be refused.",
            SECRET_ENV,
        )
    return Secret(secrets.token_bytes(32), GENERATED)


def read_secret_file(path: str) -> Secret:
    """A secret kept in a file (its first line; surrounding whitespace ignored)."""
    text = read_first_line(path, "secret file")
    return Secret(_key(text, path), f"from {path}")


def read_first_line(path: str, what: str) -> str:
    """The first line of a file holding a secret, password or token, stripped; ConfigurationError when the file
    cannot be read or that line is empty."""
    try:
        raw = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigurationError(f"cannot read the {what} {path}: {error}") from None
    lines = raw.splitlines()
    text = lines[0].strip() if lines else ""
    if not text:
        raise ConfigurationError(f"the {what} {path} is empty")
    return text


def _key(secret: str | bytes, named: str) -> bytes:
    raw = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
    if len(raw) < MIN_LENGTH:
        raise ConfigurationError(
            f"the dashboard's secret ({named}) is too short: give at least {MIN_LENGTH} characters, e.g. "
            "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
    # One key of fixed length whatever was given; the label keeps it apart from any other use of the same text.
    return hashlib.sha256(b"delay_broker dashboard secret\0" + raw).digest()
