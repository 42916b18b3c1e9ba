"""A typo in a pattern file is refused with one line naming the file and the key, never read as absent."""

from __future__ import annotations

import re
import shutil
import tomllib
from pathlib import Path

import pytest

from ncclforensics.parse.signatures import SIGNATURES_DIR, SignatureError, load_signatures
from ncclforensics.rules import engine, loader
from ncclforensics.rules.loader import RULES_DIR, RuleError, load_rules
from ncclforensics.vocabulary import VocabularyError, load_vocabulary

SAMPLE_LOGS = Path(__file__).resolve().parent.parent / "sample_logs"
RULE = "oom/OM001-out-of-memory.toml"


def _catalogue(tmp_path: Path, folder: Path, rel: str, edit) -> Path:
    """A copy of one catalogue folder (patterns/rules or patterns/signatures) with one file edited."""
    root = tmp_path / "patterns" / folder.name
    shutil.copytree(folder, root)
    path = root / rel
    path.write_text(edit(path.read_text()))
    return root


@pytest.mark.parametrize(("edit", "key"), [
    (lambda t: "policy = 1\n" + t, "'policy'"),
    (lambda t: t.replace("[[fixes]]\n", "[[fixes]]\nwhy_not = 'x'\n", 1), "'fixes.why_not'"),
    (lambda t: t.replace("[doc]\n", "[doc]\nwhat_it_detect = 'x'\n", 1), "'doc.what_it_detect'"),
    (lambda t: t.replace("[reproducer]\n", "[reproducer]\ntemplte = 'oom'\n", 1), "'reproducer.templte'"),
    (lambda t: t.replace("[[match]]\n", "[[match]]\nparms = {}\n", 1), "'match.parms'"),
])
def test_a_rule_file_with_an_unknown_key_is_refused(tmp_path: Path, edit, key: str):
    root = _catalogue(tmp_path, RULES_DIR, RULE, edit)
    with pytest.raises(RuleError, match="^" + re.escape(f"patterns/rules/{RULE}: unknown key {key} ")) as exc:
        load_rules(root)
    assert "\n" not in str(exc.value)


def test_a_detector_param_the_detector_does_not_take_is_refused(tmp_path: Path):
    first = tomllib.loads((RULES_DIR / RULE).read_text())["match"][0]["detector"]
    root = _catalogue(tmp_path, RULES_DIR, RULE, lambda t: t.replace(
        f'detector = "{first}"', f'detector = "{first}"\nparams = {{ no_such_param = 1 }}', 1))
    with pytest.raises(RuleError, match=re.escape(f"patterns/rules/{RULE}: unknown key 'match.params.no_such_param'")):
        load_rules(root)


def test_an_unknown_detector_is_refused(tmp_path: Path):
    first = tomllib.loads((RULES_DIR / RULE).read_text())["match"][0]["detector"]
    root = _catalogue(tmp_path, RULES_DIR, RULE, lambda t: t.replace(f'"{first}"', '"no_such_detector"', 1))
    with pytest.raises(RuleError, match="unknown detector 'no_such_detector'"):
        load_rules(root)


@pytest.mark.parametrize(("rel", "edit", "key"), [
    ("nccl/nccl_warn.toml", lambda t: "timelines = 'network'\n" + t, "'timelines'"),
    ("torchrun/error_file.toml", lambda t: "carier = true\n" + t, "'carier'"),  # a block parser's kind
    ("nccl/nccl_warn.toml", lambda t: t.replace("[[variants]]\n", "[[variants]]\nflags = 'i'\n", 1),
     "'variants.flags'"),
    ("nccl/nccl_warn.toml", lambda t: t.replace("[[match]]\n", "[[match]]\nfeilds = {}\n", 1), "'match.feilds'"),
])
def test_a_signature_file_with_an_unknown_key_is_refused(tmp_path: Path, rel: str, edit, key: str):
    root = _catalogue(tmp_path, SIGNATURES_DIR, rel, edit)
    with pytest.raises(SignatureError, match="^" + re.escape(f"patterns/signatures/{rel}: unknown key {key} ")) as exc:
        load_signatures(root)
    assert "\n" not in str(exc.value)


def test_a_meaning_with_an_unknown_key_is_refused(tmp_path: Path):
    root = _catalogue(tmp_path, SIGNATURES_DIR, "nccl/nccl_warn.toml",
                      lambda t: t.replace("[[meaning]]\n", "[[meaning]]\nstrenght = 'weak'\n", 1))
    with pytest.raises(VocabularyError, match=re.escape("unknown key 'meaning.strenght'")):
        load_vocabulary(root)


def test_the_command_line_says_one_line_and_exits_4(tmp_path: Path, cli, monkeypatch):
    root = _catalogue(tmp_path, RULES_DIR, RULE, lambda t: "policy = 'first'\n" + t)
    for module in (loader, engine):  # the engine holds its own name for it
        monkeypatch.setattr(module, "load_rules", lambda: load_rules(root))
    r = cli("analyze", str(SAMPLE_LOGS))
    assert r.code == 4
    assert r.err_lines == [r.err_lines[0]] and r.err_lines[0].startswith(
        f"ncclforensics: patterns/rules/{RULE}: unknown key 'policy' (known: ")
    assert "internal error" not in r.err and "traceback" not in r.err
