"""Linux signals by number: the name, the strsignal() text a log may give for each.

One table, not the stdlib's `signal` module: logs come from Linux, the analyzer may run elsewhere
(macOS numbers SIGBUS 10), and `signal.strsignal` words differ by platform. tests/test_words.py checks
the table against the stdlib on Linux.
"""

from __future__ import annotations

LINUX_SIGNALS: dict[int, tuple[str, str]] = {
    1: ("SIGHUP", "Hangup"), 2: ("SIGINT", "Interrupt"), 3: ("SIGQUIT", "Quit"),
    4: ("SIGILL", "Illegal instruction"), 5: ("SIGTRAP", "Trace/breakpoint trap"), 6: ("SIGABRT", "Aborted"),
    7: ("SIGBUS", "Bus error"), 8: ("SIGFPE", "Floating point exception"), 9: ("SIGKILL", "Killed"),
    10: ("SIGUSR1", "User defined signal 1"), 11: ("SIGSEGV", "Segmentation fault"),
    12: ("SIGUSR2", "User defined signal 2"), 13: ("SIGPIPE", "Broken pipe"), 14: ("SIGALRM", "Alarm clock"),
    15: ("SIGTERM", "Terminated"), 16: ("SIGSTKFLT", "Stack fault"), 17: ("SIGCHLD", "Child exited"),
    18: ("SIGCONT", "Continued"), 19: ("SIGSTOP", "Stopped (signal)"), 20: ("SIGTSTP", "Stopped"),
    21: ("SIGTTIN", "Stopped (tty input)"), 22: ("SIGTTOU", "Stopped (tty output)"),
    23: ("SIGURG", "Urgent I/O condition"), 24: ("SIGXCPU", "CPU time limit exceeded"),
    25: ("SIGXFSZ", "File size limit exceeded"), 26: ("SIGVTALRM", "Virtual timer expired"),
    27: ("SIGPROF", "Profiling timer expired"), 28: ("SIGWINCH", "Window changed"), 29: ("SIGIO", "I/O possible"),
    30: ("SIGPWR", "Power failure"), 31: ("SIGSYS", "Bad system call"),
}
SIGABRT, SIGBUS, SIGFPE, SIGILL, SIGINT, SIGKILL, SIGSEGV, SIGTERM = 6, 7, 8, 4, 2, 9, 11, 15

# name or text -> number; glibc before 2.34 wrote "Floating point exception", later ones a hyphen
_BY_WORDS = {w: n for n, words in LINUX_SIGNALS.items() for w in words} | {"Floating-point exception": SIGFPE}


def signal_number(text: str) -> int | None:
    """`SIGKILL`, `Killed`, `9`, `-9`, `Segmentation fault (core dumped)` -> the number; None if unknown."""
    text = text.strip()
    if text.lstrip("-").isdigit():
        return abs(int(text))
    name = text.split(" (")[0].rstrip(". ")
    return _BY_WORDS.get(name) or _BY_WORDS.get(name.capitalize())


def signal_name(sig: int | None) -> str:
    """SIGKILL for 9; 'a signal' when there is none, 'signal N' for a number Linux gives no name."""
    if not sig:
        return "a signal"
    return LINUX_SIGNALS[sig][0] if sig in LINUX_SIGNALS else f"signal {sig}"


def signal_of_exit(code: int | None) -> int | None:
    """The signal behind an exit code: -N (Python), 128+N (shells), 256-N (a launcher's sys.exit(-N))
    (FORMATS.md §18.1); None for an ordinary exit."""
    if code is None:
        return None
    if code < 0:
        return -code
    if 128 < code < 160:
        return code - 128
    if 224 < code < 256:
        return 256 - code
    return None
