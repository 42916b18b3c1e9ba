"""Hostile text: encodings, line ends, control bytes, huge lines, near-matches, markup in logs."""

from __future__ import annotations

import pytest

from ncclforensics.parse.signatures import load_signatures

from .builders import CliRun, cpu_seconds, ingest, put, reasons, run_cli, watchdog


def _lib_rows(res) -> set[tuple[int, str, int | None]]:
    df = res.events
    return set(zip(df["line"].to_list(), df["kind"].cast(str).to_list(), df["seq"].to_list(), strict=True))


def _cli_rows(events: list[dict]) -> set[tuple[int, str, int | None]]:
    return {(e["line"], e["kind"], e["seq"]) for e in events}


def _filler(n_lines: int) -> bytes:
    return b"".join(b"2026-11-22 07:44:19,330 INFO train: batch %d loss 0.5\n" % i for i in range(n_lines))


W = "watchdog_timeout"
ENCODED = {
    # latin-1 bytes are not UTF-8: they become U+FFFD, the line around them still matches
    "latin1": (b"Gr\xfc\xdfe aus K\xf6ln\n" + watchdog(11).encode() + b" caf\xe9 na\xefve\n",
               {(2, W, 11)}),
    # UTF-16 with a BOM (Windows tools, PowerShell redirects): decoded, the real line matches
    "utf16le_bom": (("hello\n" + watchdog(12) + "\nbye\n").encode("utf-16"), {(2, W, 12)}),
    "utf16be_bom": (b"\xfe\xff" + ("hello\n" + watchdog(12) + "\nbye\n").encode("utf-16-be"), {(2, W, 12)}),
    "utf8_bom": (b"\xef\xbb\xbf" + watchdog(13).encode() + b"\n", {(1, W, 13)}),
    # NULs inside a line (dropped) and a run of zeros between lines (a hole)
    "nul_bytes": (_filler(40) + watchdog(14).encode().replace(b"Watchdog", b"Watch\x00dog") + b"\n"
                  + bytes(300) + b"\n" + b"x\x00y\n" + watchdog(15).encode() + b"\n",
                  {(41, W, 14), (44, W, 15)}),
    "cr_only": (("start\r" + watchdog(16) + "\rend\r").encode(), {(2, W, 16)}),
    "crlf": (("start\r\n" + watchdog(17) + "\r\nend\r\n").encode(), {(2, W, 17)}),
    "ansi_garbage": (
        ("\x1b[2K\x1b[1G\x1b[?25l progress 10%\r\x1b[2K\n"
         + "\x1b[1m\x1b[31m" + watchdog(18).replace("[rank1]:", "[rank1]:\x1b[0m\x1b[38;5;196m")
         + "\x1b[0m\x1b]0;window title\x07 [31m\x1b(B\n"
         + "\x1b[999;999H\x1b[6n\x1bc\x1b[?1049h\n").encode(),
        {(2, W, 18)}),
    "no_final_newline": (("first\n" + watchdog(19)).encode(), {(2, W, 19)}),
}


@pytest.mark.parametrize("case", sorted(ENCODED))
def test_encodings_and_line_ends(tmp_path, case):
    _one_file_case(tmp_path, case, *ENCODED[case])


def test_colour_code_inside_a_signature_literal(tmp_path):
    line = watchdog(23).replace("Watchdog caught", "\x1b[1mWatchdog\x1b[0m caught")
    _one_file_case(tmp_path, "ansi_inside_literal", line.encode() + b"\n", {(1, W, 23)})


def _one_file_case(tmp_path, case: str, data: bytes, want: set) -> None:
    run = tmp_path / "run"
    put(run, f"{case}.log", data)
    cli = CliRun(run)
    res = ingest(run)
    assert res.skipped == []
    assert res.files == 1
    assert _lib_rows(res) == want
    assert _cli_rows(cli.finish(0).events) == want


def test_ten_megabyte_single_line(tmp_path):
    """10 MB without a newline, full of signature literals, then a real line: read in bounded time."""
    run = tmp_path / "run"
    unit = "[rank0]:[E0101 00:00:00.000000 x.cpp:1] NCCL WARN Watchdog caught collective operation timeout: "
    body = (unit * (10_000_000 // len(unit) + 1))[:10_000_000]
    put(run, "long_then_real.log", body + "\n" + watchdog(20) + "\n")
    put(run, "long_plain.log", "a" * 10_000_000)
    cli = CliRun(run)
    t0 = cpu_seconds()
    res = ingest(run)
    assert cpu_seconds() - t0 < 30
    assert (2, W, 20) in _lib_rows(res)
    assert res.files == 2
    out = cli.finish(0)
    assert (2, W, 20) in _cli_rows(out.events)
    assert out.cpu_seconds < 30
    assert all(len(e["text"]) <= 2000 for e in out.events)


def _near_misses() -> list[str]:
    """Every signature's first sample line with its last few characters cut."""
    out = []
    for sig in load_signatures().signatures:
        line = sig.samples[0]["line"]
        out.append(line[: max(1, len(line) - 4)])
    return out


def test_near_matches_of_every_signature(tmp_path):
    """1 MB of one line made of near-matches, and 1 MB of near-match lines: bounded time."""
    near = _near_misses()
    run = tmp_path / "run"
    one = " ".join(near)
    put(run, "one_line.log", (one * (1_000_000 // len(one) + 1))[:1_000_000])
    many = "\n".join(near) + "\n"
    put(run, "many_lines.log", many * (1_000_000 // len(many) + 1))
    cli = CliRun(run)
    t0 = cpu_seconds()
    res = ingest(run)
    took = cpu_seconds() - t0
    assert took < 30, f"{took:.1f} s"
    assert res.files == 2 and reasons(res) == {}
    out = cli.finish(0)
    assert out.cpu_seconds < 30


def test_markup_in_lines_hosts_and_file_names(tmp_path):
    """HTML/JS in a log is data: it comes out verbatim, as plain text, in the events JSON."""
    run = tmp_path / "run"
    fname = "<img src=x onerror=alert(1)>.log"
    script = "<script>alert('x')</script>"
    host = "<svg/onload=alert(1)>"
    nccl = (f"{host}:58213:58391 [5] misc/socket.cc:538 NCCL WARN socketProgress: Connection closed by "
            f"remote peer <b onmouseover=alert(3)>gpu-q18</b><60117>")
    put(run, fname, watchdog(21) + " " + script + "\n" + nccl + "\n")
    odd_dir = "\"'><iframe src=javascript:alert(4)>"
    put(run / odd_dir, "rank0.log", watchdog(22) + " &amp; &lt;b&gt; {{7*7}} ${7*7}\n")
    res = ingest(run)
    assert res.skipped == []
    df = res.events
    lib = dict(zip(df["seq"].to_list(), df["text"].to_list(), strict=True))
    assert script in lib[21]
    assert "&amp; &lt;b&gt; {{7*7}} ${7*7}" in lib[22]
    assert set(df["file"].to_list()) == {fname, f"{odd_dir}/rank0.log"}
    assert host in df["host"].to_list()
    out = run_cli(run, 0)
    by_seq = {e["seq"]: e for e in out.events}
    assert by_seq[21]["file"] == fname and script in by_seq[21]["text"]
    assert by_seq[22]["file"] == f"{odd_dir}/rank0.log"
    assert "&amp; &lt;b&gt; {{7*7}} ${7*7}" in by_seq[22]["text"]
    warn = [e for e in out.events if e["host"] == host and e["kind"] == "nccl_warn"]
    assert warn and "<b onmouseover=alert(3)>gpu-q18</b>" in warn[0]["text"]
    # plain JSON text: the markup is neither escaped (&lt;, \\u003c) nor dropped
    for raw in (fname, script, host, "<b onmouseover=alert(3)>"):
        assert raw in out.stdout
    assert "&lt;script" not in out.stdout and "\\u003c" not in out.stdout
