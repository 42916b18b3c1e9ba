#!/usr/bin/env python3
"""How the verdicts on a labelled corpus hold when its pastes arrive in the shapes people paste them in.

Each case's log files are rewritten by one transformation (a terminal's hard wrap, a cut end, lost line
breaks, a launcher prefix …) into OUTDIR/<transformation>/<case>/, `ncclforensics analyze --json` reads
the copy, and the class is scored against the case's label.json as tools/score_corpus.py scores it:

    python bench/perturb.py ../shared/corpus-real                      # every transformation
    python bench/perturb.py ../shared/corpus-real wrap80 onelong -v    # some, with the misses

The corpus is read in place and never changed. A transformation that removes evidence (`cut70`,
`cut_head`) is expected to cost some verdicts; one that only changes how the same lines look (`wrap80`,
`crlf`, `ansi`) should cost none. bench/README.md, "Pastes as people paste them", has the figures.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ALIASES = {"nccl_network_runtime": "network_runtime", "crash": "rank_crash", "crash/oom": "oom"}


def _wrap(width: int) -> Callable[[str], str]:
    def wrap(text: str) -> str:
        return "\n".join(line[i : i + width] for line in text.split("\n") for i in range(0, max(len(line), 1), width))
    return wrap


TRANSFORMS: dict[str, tuple[Callable[[str], str], str]] = {
    "none": (lambda t: t, "as stored"),
    "wrap80": (_wrap(80), "hard-wrapped by an 80-column terminal"),
    "wrap100": (_wrap(100), "hard-wrapped at 100 columns"),
    "wrap120": (_wrap(120), "hard-wrapped at 120 columns"),
    "crlf": (lambda t: t.replace("\n", "\r\n"), "CRLF line ends"),
    "ansi": (lambda t: "\n".join("\x1b[31m" + ln + "\x1b[0m" if "rror" in ln else ln for ln in t.split("\n")),
             "error lines in colour"),
    "onelong": (lambda t: " ".join(t.split("\n")), "every line break lost (one line)"),
    "prefix": (lambda t: "\n".join("[default3]:" + ln if ln.strip() else ln for ln in t.split("\n")),
               "a torchrun --tee prefix on every line"),
    "quote": (lambda t: "\n".join("> " + ln for ln in t.split("\n")), "markdown quote markers kept"),
    "cut70": (lambda t: t[: int(len(t) * 0.7)], "the last 30 % cut off (evidence may go)"),
    "cut_head": (lambda t: t[int(len(t) * 0.3) :], "the first 30 % cut off (evidence may go)"),
}


def class_of(case: Path, exe: list[str]) -> str:
    """The analyzer's class for one case folder, or `error: …` when it gives none."""
    proc = subprocess.run([*exe, "analyze", str(case), "--json", "-q"], capture_output=True, text=True)
    try:
        return json.loads(proc.stdout)["verdict"]["class"]
    except (ValueError, KeyError, TypeError):
        lines = (proc.stderr or proc.stdout or "no output").strip().splitlines()
        return "error: " + (lines[-1] if lines else "no output")[:120]


def right(label: dict, got: str) -> bool:
    want = ALIASES.get(label["class"], label["class"])
    return got == want or (label["class"] == "crash/oom" and got in ("oom", "rank_crash"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", type=Path, help="a folder of case folders, each with label.json and its logs")
    ap.add_argument("transforms", nargs="*", help=f"some of: {', '.join(TRANSFORMS)} (default: all)")
    ap.add_argument("--outdir", type=Path, help="where the rewritten copies go (default: a temporary folder)")
    ap.add_argument("--exe", default=f"{sys.executable} -m ncclforensics", help="the analyzer command")
    ap.add_argument("-v", "--verbose", action="store_true", help="list each transformation's misses")
    args = ap.parse_args()
    names = args.transforms or list(TRANSFORMS)
    unknown = [n for n in names if n not in TRANSFORMS]
    if unknown:
        ap.error(f"unknown transformation(s): {', '.join(unknown)}")
    cases = sorted(p.parent for p in args.corpus.glob("*/label.json"))
    if not cases:
        ap.error(f"no case folders with label.json under {args.corpus}")
    outdir = args.outdir or Path(tempfile.mkdtemp(prefix="perturb-"))
    exe = args.exe.split()
    print("| transformation | right | of | what it does |\n|---|---:|---:|---|")
    for name in names:
        fn, what = TRANSFORMS[name]
        misses = []
        for case in cases:
            dst = outdir / name / case.name
            shutil.rmtree(dst, ignore_errors=True)
            dst.mkdir(parents=True)
            for f in case.iterdir():
                if f.is_file() and f.name != "label.json":
                    (dst / f.name).write_text(fn(f.read_text(errors="replace")))
            label = json.loads((case / "label.json").read_text())
            got = class_of(dst, exe)
            if not right(label, got):
                misses.append(f"{case.name}: want {ALIASES.get(label['class'], label['class'])}, got {got}")
        print(f"| {name} | {len(cases) - len(misses)} | {len(cases)} | {what} |", flush=True)
        if args.verbose:
            for m in misses:
                print(f"    {m}", file=sys.stderr)
    if args.outdir is None:
        shutil.rmtree(outdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
