"""Lines that differ only in their digits (FORMATS.md §1: every rank prints the same lines with its own
rank, stamps, counts): a pattern that treats the ten ASCII digits alike answers such lines alike.

A line comes from every rank of a run with other numbers in it (`[Rank 1499] Watchdog caught …
SeqNum=2547 … ran for 600020 milliseconds`), so caches keyed by the exact text miss. A pattern that
treats the ten ASCII digits alike (no digit of its own, no class holding some digits but not all,
no back-reference) matches two texts that differ only in which digits they hold at the same places
alike, with the same spans. Decided on Python's parse of the pattern; a pattern it cannot parse
(the `regex` module's own syntax) is not blind. Used by the signature matching
(parse.signatures.SignatureSet.match_all) and the envelope peeling (ingest.envelope._peel).
"""

from __future__ import annotations

import re
import re._constants as _sre
import re._parser as _sre_parse
import sys

from ncclforensics.diskcache import JsonFile

_DIGITS = frozenset(range(0x30, 0x3A))
_DIGIT_CHARS = frozenset("0123456789")
_ALL_DIGITS = {_sre.CATEGORY_DIGIT, _sre.CATEGORY_WORD, _sre.CATEGORY_NOT_SPACE, _sre.CATEGORY_NOT_LINEBREAK,
               _sre.CATEGORY_UNI_DIGIT, _sre.CATEGORY_UNI_WORD, _sre.CATEGORY_UNI_NOT_SPACE,
               _sre.CATEGORY_UNI_NOT_LINEBREAK, _sre.CATEGORY_LOC_WORD}
_NO_DIGITS = {_sre.CATEGORY_NOT_DIGIT, _sre.CATEGORY_NOT_WORD, _sre.CATEGORY_SPACE, _sre.CATEGORY_LINEBREAK,
              _sre.CATEGORY_UNI_NOT_DIGIT, _sre.CATEGORY_UNI_NOT_WORD, _sre.CATEGORY_UNI_SPACE,
              _sre.CATEGORY_UNI_LINEBREAK, _sre.CATEGORY_LOC_NOT_WORD}
ZERO_DIGITS = str.maketrans("123456789", "000000000")  # a text's shape: its digits made 0
_ZERO_BYTES = bytes.maketrans(b"123456789", b"000000000")


def shape_of(body: str) -> str:
    """body.translate(ZERO_DIGITS), by bytes (~0.5 µs for a 200-character line, str.translate ~4 µs): an
    ASCII digit's byte is never part of another character's UTF-8 bytes."""
    return body.encode("utf-8", "surrogatepass").translate(_ZERO_BYTES).decode("utf-8", "surrogatepass")


_GROUP_NAME = re.compile(r"(?<!\\)\(\?P<\w+>")


def digit_guards(pattern: str) -> tuple[str, ...] | None:
    """The shapes of the literal texts holding a digit that `pattern` reads (`[c10d] `, `got 0 bytes`),
    when everything else in it treats every digit alike; None where something else sees digits (a
    class with some digits, a back-reference, such a text under IGNORECASE, a pattern Python cannot
    parse). A line whose shape holds none of them meets the pattern as a blind one: each of those texts
    would appear whole in a line it matched, and its shape in that line's shape. The `regex` module
    lets variants' alternatives share a group name, Python's parser does not: names are made unique
    first (a name never decides how a character matches)."""
    names = iter(range(1 << 30))
    try:
        tree = _sre_parse.parse(_GROUP_NAME.sub(lambda _: f"(?P<g{next(names)}>", pattern))
    except Exception:
        return None
    guards: set[str] = set()
    if not _blind(tree, guards, bool(tree.state.flags & re.IGNORECASE)):
        return None
    return tuple(sorted(guards))


def digit_blind(pattern: str) -> bool:
    """Whether `pattern` treats every ASCII digit alike (see above): no guard needed."""
    return digit_guards(pattern) == ()


class BlindCache(JsonFile):
    """digit_guards' answers by pattern, kept in one file under the user's cache folder (parsing a
    pattern takes ~0.3 ms: the signatures and envelopes a small run meets would cost start-up ~10 ms).
    One file per Python version (its parser decides); written merged with what another process saved."""

    def __init__(self) -> None:
        super().__init__(f"digit-guards-py{sys.version_info[0]}{sys.version_info[1]}.json")

    def get(self, pattern: str) -> tuple[str, ...] | None:
        answers = self.table()
        got = answers.get(pattern, False)
        if got is None or (isinstance(got, list) and all(isinstance(x, str) for x in got)):
            return None if got is None else tuple(got)
        guards = digit_guards(pattern)
        answers[pattern] = None if guards is None else list(guards)
        self.changed()
        return guards

    def blind(self, pattern: str) -> bool:
        return self.get(pattern) == ()

    def kept(self, entries: dict) -> dict:
        return {**self._read(), **entries}


BLIND = BlindCache()


def _blind(items, guards: set[str], icase: bool) -> bool:
    """Whether the items treat every digit alike but in runs of literal text, whose shapes go to `guards`."""
    run: list[str] = []

    def flush() -> bool:
        if any(c in _DIGIT_CHARS for c in run):
            if icase:
                return False
            guards.add(shape_of("".join(run)))
        run.clear()
        return True

    for op, av in items:
        if op is _sre.LITERAL:
            run.append(chr(av))
            continue
        if not flush():
            return False
        if op is _sre.NOT_LITERAL:
            if av in _DIGITS:
                return False
        elif op is _sre.IN:
            if not _class_blind(av):
                return False
        elif op is _sre.SUBPATTERN:
            flags = icase or bool(av[1] & re.IGNORECASE)
            if not _blind(av[3], guards, flags and not av[2] & re.IGNORECASE):
                return False
        elif op in (_sre.MAX_REPEAT, _sre.MIN_REPEAT, _sre.POSSESSIVE_REPEAT):
            if not _blind(av[2], guards, icase):
                return False
        elif op is _sre.BRANCH:
            if not all(_blind(alt, guards, icase) for alt in av[1]):
                return False
        elif op in (_sre.ASSERT, _sre.ASSERT_NOT):
            if not _blind(av[1], guards, icase):
                return False
        elif op is _sre.ATOMIC_GROUP:
            if not _blind(av, guards, icase):
                return False
        elif op not in (_sre.AT, _sre.ANY):
            return False  # back-references, conditionals, anything else: not provably blind
    return flush()


def _class_blind(items) -> bool:
    """Whether a character class holds all ten digits or none."""
    held: set[int] = set()
    for op, av in items:
        if op is _sre.NEGATE:
            continue  # the complement of all or none is none or all
        if op is _sre.LITERAL:
            if av in _DIGITS:
                held.add(av)
        elif op is _sre.RANGE:
            held.update(d for d in _DIGITS if av[0] <= d <= av[1])
        elif op is _sre.CATEGORY and av in _ALL_DIGITS:
            held.update(_DIGITS)
        elif not (op is _sre.CATEGORY and av in _NO_DIGITS):
            return False
    return len(held) in (0, len(_DIGITS))


class ShapeMemo(dict):
    """Answers kept by shape (a text's digits made 0) for shapes met more than once: a line that every
    rank prints comes again within a rank or two, a line with a pointer or a hash of its own never,
    and keeping what those answered would only hold memory (~1 KB each). A shape's first sighting
    leaves its hash only; `admit` on the second says to keep its answers. At most `entries` shapes
    are kept, then it starts again."""

    def __init__(self, entries: int) -> None:
        super().__init__()
        self.entries = entries
        self._once: set[int] = set()

    def admit(self, shape: str) -> bool:
        """Whether answers for `shape` (not kept yet) should be kept: it was met before."""
        h = hash(shape)
        if h in self._once:
            if len(self) >= self.entries:
                self.clear()
            return True
        if len(self._once) >= 8 * self.entries:
            self._once.clear()
        self._once.add(h)
        return False
