"""The wheel a user installs: built from this tree, installed into a fresh venv, run from another folder.

The pattern catalogue must ship inside it (ncclforensics/patterns); without it every analysis would
read as `unknown`, so a missing catalogue must be a loud exit 4, which the last step checks.
Dependencies come from the package index (pip's cache makes a second run quick); --no-compile
skips byte-compiling plotly's thousands of files.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from ncclforensics import __version__
from ncclforensics.errors import CatalogueError
from ncclforensics.parse.signatures import PATTERNS_DIR, load_signatures
from ncclforensics.rules.loader import load_rules

ROOT = Path(__file__).resolve().parents[1]


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False, **kw)
    assert p.returncode == 0, f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    return p


def test_catalogue_found_in_the_checkout():
    assert PATTERNS_DIR == ROOT / "patterns"


def test_empty_catalogue_is_an_internal_error(tmp_path):
    for load in (load_signatures, load_rules):
        with pytest.raises(CatalogueError) as exc:
            load(tmp_path)
        assert exc.value.exit_code == 4 and "pattern catalogue" in exc.value.message


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv with the wheel of this tree installed; returns its bin folder."""
    tmp = tmp_path_factory.mktemp("wheel")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    _run([*pip, "wheel", str(ROOT), "--no-deps", "-q", "-w", str(tmp / "dist")])
    wheels = sorted((tmp / "dist").glob("ncclforensics-*.whl"))
    assert len(wheels) == 1, wheels
    names = set(zipfile.ZipFile(wheels[0]).namelist())
    shipped = {p.relative_to(ROOT).as_posix() for p in (ROOT / "patterns").rglob("*") if p.is_file()}
    missing = {f"ncclforensics/{p}" for p in shipped} - names
    assert not missing, f"not in the wheel: {sorted(missing)[:5]}"
    assert not any(n.startswith(("tests/", "bench/", "sample_logs/", "patterns/")) for n in names)
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    _run([*pip, "--python", str(venv / "bin" / "python"), "install", "-q", "--no-compile", str(wheels[0])])
    return venv / "bin"


def test_wheel_diagnoses_the_sample_from_another_folder(installed, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    exe = str(installed / "ncclforensics")
    assert _run([exe, "--version"], cwd=elsewhere).stdout.strip() == f"ncclforensics {__version__}"
    doc = json.loads(_run([exe, "analyze", str(ROOT / "sample_logs"), "--json"], cwd=elsewhere).stdout)
    assert doc["verdict"]["class"] == "rank_divergence"
    assert doc["verdict"]["culprit_ranks"] == [0]
    where = _run([str(installed / "python"), "-c",
                  "import ncclforensics.parse.signatures as s; print(s.PATTERNS_DIR)"], cwd=elsewhere).stdout
    assert Path(where.strip()).parent.name == "ncclforensics" and ROOT not in Path(where.strip()).parents
    # the report's vendored plotly.js ships too (report/assets)
    _run([exe, "analyze", str(ROOT / "sample_logs"), "--html", "r.html", "-q"], cwd=elsewhere)
    assert 'id="plotly-gz"' in (elsewhere / "r.html").read_text()


def test_wheel_without_catalogue_fails_loudly(installed, tmp_path):
    """Last in this file: it breaks the installed package."""
    code = "import ncclforensics, os; print(os.path.dirname(ncclforensics.__file__))"
    site = _run([str(installed / "python"), "-c", code], cwd=tmp_path).stdout.strip()
    shutil.rmtree(Path(site) / "patterns")
    p = subprocess.run([str(installed / "ncclforensics"), "analyze", str(ROOT / "sample_logs")], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 4, p.stderr
    assert p.stdout == "" and len(p.stderr.strip().splitlines()) == 1
    assert "pattern catalogue is missing or empty" in p.stderr and "Traceback" not in p.stderr
