"""A griffe extension for the API reference: reST markup in docstrings becomes Markdown.

The docstrings use Sphinx cross-reference roles (``:class:`~posdebias.Debiaser```) and reST's
``::`` before an indented example, which ``help()`` and IDEs show well but Markdown renders
literally. mkdocstrings loads this extension (mkdocs.yml), so the reference shows ``Debiaser``
as code and the example as a code block.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const|term):`([^`]+)`")


def _target(text: str) -> str:
    """What a role shows: ``Title <target>`` -> Title, ``~a.b.C`` -> C, ``a.b.C`` -> a.b.C."""
    titled = re.fullmatch(r"(.+?)\s*<[^>]+>", text)
    if titled:
        return titled.group(1)
    if text.startswith("~"):
        return text[1:].rsplit(".", 1)[-1]
    return text.lstrip("!")


def plain_roles(text: str) -> str:
    """``text`` with every Sphinx role replaced by Markdown inline code and every reST ``::``
    literal-block marker by a colon (the indented block after it is Markdown code already)."""
    text = _ROLE.sub(lambda match: f"`{_target(match.group(1))}`", text)
    text = re.sub(r"^\s*::\s*$", "", text, flags=re.M)
    return re.sub(r"(\S)::$", r"\1:", text, flags=re.M)


class SphinxRolesAsCode(griffe.Extension):
    """Rewrites each loaded object's docstring with :func:`plain_roles`."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain_roles(obj.docstring.value)
