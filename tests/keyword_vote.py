"""A keyword vote over a case's text: the baseline the analyzer must never fall below (DESIGN.md §3).

One regex family per class, taken from DESIGN.md §3's table of typical evidence: the class whose
family has the most hits in the text wins (ties: the order below). No structure, no causal order, no
ranks. (Written from the design, not from the corpus it is scored on.)
"""

from __future__ import annotations

import re
from pathlib import Path

# Each family is DESIGN.md §3's "typical evidence" column for its class, as grep alternatives.
FAMILIES: dict[str, re.Pattern[str]] = {
    "rank_divergence": re.compile(
        r"Detected mismatch between collectives|Watchdog caught collective operation timeout|SeqNum|OpType|"
        r"desync|fingerprint", re.I),
    "checkpoint_save": re.compile(r"checkpoint|\bsav(?:e|ing)\b|consolidat", re.I),
    "network_init": re.compile(
        r"DistNetworkError|DistStoreError|Rendezvous|Address already in use|EADDRINUSE|EACCES|Permission denied|"
        r"socket|Bootstrap|host ?name|MASTER_ADDR", re.I),
    "dataloader_abort": re.compile(r"DataLoader worker|bus error|shm", re.I),
    "gpu_hardware": re.compile(r"\bXid\b|\bECC\b|NVLink|fallen off the bus|GPU is lost|NVML|\bAER\b", re.I),
    "oom": re.compile(r"out of memory|\bOOM\b|Killed process|SIGKILL|-9\b", re.I),
    "rank_crash": re.compile(
        r"Traceback|exception|signal|illegal memory access|device-side assert|Connection closed by peer|"
        r"remote process exited", re.I),
    "network_runtime": re.compile(r"NET/IB|\bIB\b|completion|Connection reset|network error", re.I),
    "launch_config": re.compile(r"Duplicate GPU|/dev/shm|invalid device ordinal|same GPU", re.I),
}


def vote(text: str) -> str:
    counts = {cls: len(rx.findall(text)) for cls, rx in FAMILIES.items()}
    best = max(counts.values())
    if best == 0:
        return "unknown"
    return next(cls for cls, n in counts.items() if n == best)


def case_text(case: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(case.iterdir())
                     if p.is_file() and p.name != "label.json")
