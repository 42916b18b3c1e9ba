"""Multi-line shapes (FORMATS.md §15.1): Python tracebacks, torchrun ChildFailedError, NCCL `Last error:`."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ncclforensics.model import CALL_OPS

MAX_BLOCK_LINES = 400

TRACEBACK_START = "Traceback (most recent call last):"
CHILD_FAILED = "ChildFailedError:"
LAST_ERROR = "Last error:"
CPP_WHAT = "what():"
FAULT_STACK = ("most recent call first):",)
BLOCK_LITERALS = (TRACEBACK_START, CHILD_FAILED, LAST_ERROR) + FAULT_STACK

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]{1,500})", line (?P<line>\d+),? in (?P<fn>[\w<>.]{1,200})')
_FRAME_START = re.compile(r'^\s*File "')

# a physical line this long may have been hard-wrapped by a terminal (FORMATS.md §1.8: widths ~80-200): its
# rest is on the next line, without indentation or envelope
WRAP_MIN = 72
WRAP_PIECES = 3  # continuation lines joined to one traceback line at most


def indented(text: str) -> bool:
    """Whether a line is indented (a traceback's frame or code, a block's field: two spaces or a tab on).
    One space and then text is where a terminal's hard wrap cut a line just before a space (§1.8)."""
    return text[:1].isspace() and not (text[:1] == " " and not text[1:2].isspace())
_EXC = re.compile(
    r"^(?P<type>[A-Za-z_][\w.]{0,200}?(?:Error|Exception|Exit|Interrupt|Warning|Failure|Timeout)?)(?::(?P<msg>.*))?$")
_CHAIN = ("The above exception was the direct cause", "During handling of the above exception")
_CF_FIELD = re.compile(r"^\s{2}(?P<key>time|host|rank|exitcode|error_file|traceback)\s*: ?(?P<val>.*)$")
_CF_RANK = re.compile(r"(?P<rank>-?\d+) \(local_rank: (?P<lr>\d+)\)")
_CF_EXIT = re.compile(r"(?P<code>-?\d+) \(pid: (?P<pid>\d+)\)(?:\s+\((?P<sig>SIG\w+)\))?")
_CF_IDX = re.compile(r"^\[(?P<idx>\d+)\]:\s*$")


@dataclass
class Block:
    kind: str
    line_offset: int  # index of the block's first line in the given lines
    fields: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    detail: str = ""
    text: str = ""


def _exc_line(body: str) -> re.Match[str] | None:
    if not body or body[0].isspace() or body.startswith(("File ", "Traceback")):
        return None
    m = _EXC.match(body)
    if m is None or ("." not in m.group("type") and not m.group("type")[0].isupper()):
        return None
    if m.group("msg") is None and not re.search(r"(?:Error|Exception|Exit|Interrupt)$", m.group("type")):
        return None
    return m


# Frames of installed libraries and of torch itself, never the user's own code: where a stack
# leaves these is the line an engineer opens first.
_LIBRARY_PATH = re.compile(
    r"(?:site|dist)-packages/|/lib/python\d|^<|(?:^|/)torch/(?:distributed|nn|autograd|utils|cuda|_\w+)/|"
    r"/bin/[^/.]+$")  # an environment's entry point (bin/torchrun, bin/deepspeed)
MAX_USER_FRAMES = 4


def is_library_path(path: str) -> bool:
    return bool(_LIBRARY_PATH.search(path.replace("\\", "/")))


def short_path(path: str, parts: int = 2) -> str:
    """`/home/user/train/make_sample.py` -> `train/make_sample.py`: enough to find the file, short to show."""
    return "/".join(path.replace("\\", "/").rstrip("/").split("/")[-parts:])


def user_frames(frames: Sequence[dict]) -> list[dict]:
    """The innermost user (non-library) frames of a stack given innermost last, innermost last."""
    out = [{"file": short_path(f["file"]), "line": f["line"], "fn": f["fn"], "code": f.get("code", "")}
           for f in frames if f.get("file") and not is_library_path(str(f["file"]))]
    return out[-MAX_USER_FRAMES:]


def op_from_frames(frames: Sequence[dict]) -> str | None:
    """The collective a stack was in: the innermost torch.distributed (or autograd, for DDP's
    gradient all-reduce) frame whose function issues one. Gloo prints no OpType (§6)."""
    for fr in reversed(frames):
        op = CALL_OPS.get(fr["fn"])
        if op is None:
            continue
        path = fr["file"].replace("\\", "/")
        if "torch/distributed" in path or "torch/autograd" in path or "dist." in fr.get("code", ""):
            return op
    return None


def parse_traceback(bodies: Callable[[int], str | None], start: int) -> tuple[Block | None, int]:
    """A Python traceback starting at body `start` (the `Traceback …` line).

    `bodies(i)` returns the i-th line's body for the same writer, or None at the end.
    Returns the block and the number of lines consumed.
    """
    frames: list[dict] = []
    i = start + 1
    while i - start < MAX_BLOCK_LINES:
        body = bodies(i)
        if body is None:
            break
        fm = _FRAME.match(body)
        if fm is None and _FRAME_START.match(body) and len(body) >= WRAP_MIN:
            # a frame line hard-wrapped at the terminal's width (§1.8): `File "/…/transformer` + `s/trainer.py",
            # line 1537, in train`
            fm, used = _wrapped_frame(bodies, i, body)
            if fm is not None:
                i += used
        elif fm is not None and len(body) >= WRAP_MIN:
            # a whole frame whose function name the wrap cut: `in _save_check` + `point`
            n = _wrap_rest(bodies, i + 1)
            if n:
                fm = _FRAME.match(body + "".join(bodies(i + 1 + k) or "" for k in range(n))) or fm
                i += n
        if fm is not None:
            frames.append({"file": fm.group("file"), "line": int(fm.group("line")), "fn": fm.group("fn"), "code": ""})
            i += 1
            continue
        if body.startswith((" ", "\t")) or not body.strip():
            if frames and not frames[-1]["code"] and body.strip() and not set(body.strip()) <= set("^~ "):
                frames[-1]["code"] = body.strip()[:200]
            i += 1
            if len(body) >= WRAP_MIN:  # a code line cut by the wrap: its rest is no exception line
                i += _wrap_rest(bodies, i)
            continue
        m = _exc_line(body)
        if m is not None:
            exc_type = m.group("type")
            msg = (m.group("msg") or "").strip()
            tail = [{"file": f["file"].rsplit("/", 1)[-1], "line": f["line"], "fn": f["fn"], "code": f["code"]}
                    for f in frames[-6:]]
            # every function on the stack, innermost last: where an exception came from matters
            # (raised inside the DataLoader's fetch path = a worker died, FORMATS.md §11)
            stack = list(dict.fromkeys(f"{f['file'].rsplit('/', 1)[-1]}:{f['fn']}" for f in frames))[-40:]
            blk = Block(kind="exception", line_offset=i, detail=f"{exc_type}: {msg}"[:1500] if msg else exc_type,
                        extra={"exc_type": exc_type, "frames": tail, "stack": stack, "start_offset": start,
                               "user_frames": user_frames(frames)})
            op = op_from_frames(frames)
            if op:
                blk.fields["op"] = op
            return blk, i - start + 1
        break
    return None, max(1, i - start)


def _continues(body: str | None) -> str | None:
    """The line, when it can be the rest of a hard-wrapped one (text, neither indented nor a frame); else None."""
    if body is None or not body.strip() or indented(body) or _FRAME_START.match(body):
        return None
    return body


def _wrapped_frame(bodies: Callable[[int], str | None], i: int, body: str) -> tuple[re.Match[str] | None, int]:
    """A frame line cut by a hard wrap, joined with up to WRAP_PIECES lines after it: (the frame's match,
    the lines joined), or (None, 0) when no join makes a frame."""
    joined = body
    for k in range(1, WRAP_PIECES + 1):
        nxt = _continues(bodies(i + k))
        if nxt is None:
            return None, 0
        joined += nxt
        fm = _FRAME.match(joined)
        if fm is not None:
            return fm, k
        if len(nxt) < WRAP_MIN:
            return None, 0  # only a piece filled to the width runs on
    return None, 0


def _wrap_rest(bodies: Callable[[int], str | None], i: int) -> int:
    """How many lines from i are the rest of a long traceback line before them that a hard wrap cut (§1.8):
    text that is no frame, no exception line and no chained-exception header; each but the last filled."""
    n = 0
    while n < WRAP_PIECES:
        nxt = _continues(bodies(i + n))
        if nxt is None or _exc_line(nxt) is not None or nxt.startswith(_CHAIN):
            break
        n += 1
        if len(nxt) < WRAP_MIN:
            break
    return n


def parse_fault_stack(bodies: Callable[[int], str | None], start: int) -> tuple[Block | None, int]:
    """faulthandler's `Current thread 0x… (most recent call first):` frame list (innermost first)."""
    frames = []
    i = start + 1
    fr = re.compile(r'^\s*File "(?P<file>[^"]{1,500})", line (?P<line>\d+) in (?P<fn>[\w<>.]{1,200})')
    while i - start < 60:
        body = bodies(i)
        if body is None:
            break
        m = fr.match(body)
        if m is None:
            break
        frames.append({"file": m.group("file"), "line": int(m.group("line")), "fn": m.group("fn"), "code": ""})
        i += 1
    if not frames:
        return None, 1
    frames.reverse()  # innermost last, as in a traceback
    blk = Block(kind="fault_stack", line_offset=start,
                extra={"frames": [{"file": f["file"].rsplit("/", 1)[-1], "line": f["line"], "fn": f["fn"]}
                                  for f in frames[-6:]], "user_frames": user_frames(frames)})
    op = op_from_frames(frames)
    if op:
        blk.fields["op"] = op
    blk.detail = "faulthandler stack: " + " <- ".join(f["fn"] for f in reversed(frames[-4:]))
    return blk, i - start


def parse_child_failed(bodies: Callable[[int], str | None], start: int) -> tuple[list[Block], int]:
    """torchrun's ChildFailedError summary (FORMATS.md §8.2): one block per failure entry."""
    out: list[Block] = []
    cur: Block | None = None
    borders = 0
    root_section = False
    in_tb = False
    tb_lines: list[str] = []
    i = start + 1

    def close() -> None:
        nonlocal cur, tb_lines
        if cur is not None:
            tb = [t.strip() for t in tb_lines if t.strip()]
            if tb:
                cur.detail = tb[-1][:1500]
                cur.extra["traceback_tail"] = tb[-3:]
            out.append(cur)
        cur = None
        tb_lines = []

    while i - start < MAX_BLOCK_LINES:
        body = bodies(i)
        if body is None:
            break
        stripped = body.strip()
        if stripped and set(stripped) == {"="}:
            borders += 1
            if borders >= 2:
                i += 1
                break
            i += 1
            continue
        if stripped and set(stripped) == {"-"}:
            in_tb = False
            i += 1
            continue
        if stripped.startswith("Root Cause"):
            close()
            root_section = True
            in_tb = False
            i += 1
            continue
        m = _CF_IDX.match(body)
        if m is not None:
            close()
            in_tb = False
            cur = Block(kind="child_failed", line_offset=i - start,
                        extra={"idx": int(m.group("idx")), "root_cause": root_section})
            i += 1
            continue
        fm = _CF_FIELD.match(body)
        if cur is not None and fm is not None and not (in_tb and fm.group("key") != "traceback"
                                                       and not body.startswith("  " + fm.group("key"))):
            key, val = fm.group("key"), fm.group("val").strip()
            in_tb = False
            if key == "time":
                try:
                    cur.fields["ts"] = dt.datetime.strptime(val, "%Y-%m-%d_%H:%M:%S")
                except ValueError:
                    pass
            elif key == "host":
                cur.fields["host"] = val[:255]
            elif key == "rank":
                rm = _CF_RANK.search(val)
                if rm:
                    cur.fields["rank"] = int(rm.group("rank"))
                    cur.fields["local_rank"] = int(rm.group("lr"))
            elif key == "exitcode":
                cur.line_offset = i - start  # the row points at the exit code line: evidence reads well
                em = _CF_EXIT.search(val)
                if em:
                    cur.fields["code"] = int(em.group("code"))
                    cur.fields["pid"] = int(em.group("pid"))
                    if em.group("sig"):
                        cur.extra["signal"] = em.group("sig")
            elif key == "error_file":
                cur.extra["error_file"] = val[:500]
            elif key == "traceback":
                in_tb = True
                tb_lines = [val]
            i += 1
            continue
        if in_tb:
            tb_lines.append(body)
        i += 1
    close()
    if not out:  # no summary followed the header (a cut paste, an export in newest-first order): its lines are others'
        return out, 1
    return out, i - start


def parse_last_error(bodies: Callable[[int], str | None], start: int) -> str | None:
    """The WARN text on the line after `Last error:` (the best NCCL root-cause clue, §5.1)."""
    nxt = bodies(start + 1)
    return nxt.strip()[:1500] if nxt and nxt.strip() else None
