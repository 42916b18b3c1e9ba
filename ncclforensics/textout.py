"""The words the terminal summary (termout.py), the Markdown (mdout.py) and the report share."""

from __future__ import annotations

from ncclforensics.model import Finding


def collective_words(f: Finding) -> str:
    c = f.collective
    if not c.op_type and c.seq is None:
        return "none identified"
    pg = f"PG {c.pg} " if c.pg else ""
    seq = f"SeqNum {c.seq}" if c.seq is not None else "SeqNum unknown"
    return f"{pg}{c.op_type or 'unknown op'}, {seq}"
