"""The documents `analyze` writes: one enum of formats, each mapped to its formatter with its file name.

The terminal summary (termout.py) is no document: it is what `analyze` prints when no document goes
to stdout, laid out for the terminal. Adding a format is an entry here, its formatter module and a
flag in cli.py.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ncclforensics.analysis import Analysis
    from ncclforensics.incident import IncidentContext  # read from the logs only when a format shows context lines

MD_CONTEXT_LINES = 3  # lines around each evidence line in --md and report.md, unless -C says otherwise
HTML_CONTEXT_LINES = 10  # lines above and below each evidence line in the report (collapsed there)


class DocFormat(StrEnum):
    HTML = "html"
    JSON = "json"
    MARKDOWN = "md"


@dataclass(frozen=True)
class Inputs:
    """What a formatter reads: the analysis, its reproducer and the lines read around the evidence."""

    analysis: Analysis
    repro: object | None  # repro.render.Reproducer
    context: IncidentContext | None  # already narrowed to the lines this format shows
    generated: datetime | None = None  # the report's "generated" time (None: now)
    plotly_src: str | None = None  # a scan's shared plotly.js (None: inlined)


def _html(x: Inputs) -> str:
    from ncclforensics.report.render import render_report

    return render_report(x.analysis, x.repro, incident=x.context, generated=x.generated, plotly_src=x.plotly_src)


def _json(x: Inputs) -> str:
    from ncclforensics.jsonout import diagnosis_dict

    return json.dumps(diagnosis_dict(x.analysis.diagnosis, x.repro), indent=2, default=str) + "\n"


def _markdown(x: Inputs) -> str:
    from ncclforensics.mdout import markdown

    return markdown(x.analysis.diagnosis, x.repro, context=x.context)


@dataclass(frozen=True)
class DocSpec:
    render: Callable[[Inputs], str]
    file_name: str  # in `analyze -o DIR` and in a scan's runs/<id>/
    context_lines: Callable[[int | None], int | None]  # `-C N` -> lines it shows around evidence (None: none read)


# in the order `analyze -o` writes and names them
FORMATS: dict[DocFormat, DocSpec] = {
    DocFormat.HTML: DocSpec(_html, "report.html", lambda _c: HTML_CONTEXT_LINES),
    DocFormat.JSON: DocSpec(_json, "diagnosis.json", lambda _c: None),
    DocFormat.MARKDOWN: DocSpec(_markdown, "report.md", lambda c: MD_CONTEXT_LINES if c is None else c),
}


def render(fmt: DocFormat, inputs: Inputs, *, context_arg: int | None = None) -> str:
    """The document `fmt`, shown with as many lines around the evidence as it wants (`context_arg`: -C N)."""
    spec = FORMATS[fmt]
    lines = spec.context_lines(context_arg)
    ctx = inputs.context.narrowed(lines) if inputs.context is not None and lines is not None else inputs.context
    return spec.render(dataclasses.replace(inputs, context=ctx))


def context_lines(formats: list[DocFormat], context_arg: int | None) -> int | None:
    """Lines to read around each evidence line, once, for the widest of these formats and the terminal
    (`-C N`); None when none of them shows any."""
    wanted = [n for f in formats if (n := FORMATS[f].context_lines(context_arg)) is not None]
    if context_arg is not None:
        wanted.append(context_arg)
    return max(wanted) if wanted else None


def reproducer(analysis: Analysis) -> tuple[object | None, str | None]:
    """(the verdict's reproducer, None), (None, why there is none) when rendering it failed, or
    (None, None) when the verdict has no reproducer template."""
    diag = analysis.diagnosis
    if diag.verdict.reproducer is None:
        return None, None
    from ncclforensics.repro.render import NoReproducer, render_reproducer

    try:
        return render_reproducer(diag.verdict, diag.facts), None
    except NoReproducer as exc:  # the rule says why it has none
        return None, str(exc)
    except Exception as exc:  # a renderer bug must not cost the diagnosis
        return None, f"{type(exc).__name__}: {str(exc)[:160]}"
