"""A griffe extension for the API reference (mkdocs.yml): the docstrings' reST markup as Markdown.

The code's docstrings are written in the reST of Python's own docs (``code``, :class:`Name`, ``Example::``),
which mkdocstrings renders as Markdown: without this, the roles and double backquotes would show as typed.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj|const):`~?([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")
_BLOCK_INTRO = re.compile(r"(?<=\S)::$|^::$", re.MULTILINE)


def markdown(text: str) -> str:
    """``text`` with reST roles and inline literals as code spans, and ``::`` block intros as ``:``."""
    text = _ROLE.sub(_role, text)
    text = _LITERAL.sub(r"`\1`", text)
    return _BLOCK_INTRO.sub(":", text)


def _role(match: re.Match[str]) -> str:
    """``:class:`~a.b.C``` shows ``C``, as Sphinx does; ``:class:`a.b.C``` the whole path."""
    target = match.group(1)
    return f"`{target.rsplit('.', 1)[-1] if '~' in match.group(0) else target}`"


class RestToMarkdown(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
