"""The Markdown of patterns/ (rule docs, fix notes) -> escaped HTML for the report, plain text elsewhere."""

from __future__ import annotations

import functools

from markdown_it import MarkdownIt
from markupsafe import Markup


@functools.cache
def _md() -> MarkdownIt:
    # "html": False escapes any tag in the text; images are off (a report never fetches anything);
    # links stay text-only links an engineer may click
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
    md.disable(["image", "html_block", "html_inline"])
    return md


def to_html(text: str) -> Markup:
    """Markdown -> HTML that is safe to insert: every character of `text` is escaped or Markdown syntax."""
    return Markup(_md().render(text or "").strip())


def to_inline_html(text: str) -> Markup:
    """One paragraph's Markdown without the <p> around it (a fix's note inside its own <p>)."""
    return Markup(_md().renderInline(text or ""))
