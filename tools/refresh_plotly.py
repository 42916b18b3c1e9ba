#!/usr/bin/env python3
"""Refresh the vendored plotly.js bundle (ncclforensics/report/assets/) from the npm registry.

The report inlines the smallest official plotly.js distribution that draws its traces (DESIGN.md §5):
the partial `cartesian` bundle (scatter, heatmap, bar, ...), not the 4.8 MB full one that plotly.py
ships. This script fetches it with npm's own client (`npm pack`), checks the registry's sha512
integrity, and writes

  plotly-cartesian.min.js.gz   the bundle, gzip -9, deterministic (no name, mtime 0)
  plotly-LICENSE.txt           the package's licence text
  plotly.json                  package, version, licence, integrity, sha256, sizes and the trace
                               types the bundle registers (read from the bundle itself)

Usage: python tools/refresh_plotly.py [--version X.Y.Z] [--package NAME]
The default version is the plotly.js that the installed plotly.py was built for, so the figure JSON
plotly.py writes matches the library that draws it.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import hashlib
import json
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ASSETS = Path(__file__).resolve().parent.parent / "ncclforensics" / "report" / "assets"
PACKAGE = "plotly.js-cartesian-dist-min"
# a trace module registers itself as {moduleType:"trace",name:"scatter",...} in every build
TRACE_RE = re.compile(rb'moduleType:"trace",name:"(\w+)"')


def default_version() -> str:
    import plotly.offline

    return plotly.offline.get_plotlyjs_version()


def npm_pack(spec: str, where: Path) -> dict:
    out = subprocess.run(["npm", "pack", spec, "--json", "--pack-destination", str(where)], check=True,
                         capture_output=True, text=True).stdout
    info = json.loads(out)
    return info[0] if isinstance(info, list) else info


def check_integrity(tgz: Path, integrity: str) -> None:
    algo, _, want = integrity.partition("-")
    got = base64.b64encode(hashlib.new(algo, tgz.read_bytes()).digest()).decode()
    if got != want:
        sys.exit(f"refresh_plotly: {tgz.name}: {algo} {got} does not match the registry's {want}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", default=None, help="plotly.js version (default: the one plotly.py expects)")
    ap.add_argument("--package", default=PACKAGE)
    args = ap.parse_args()
    version = args.version or default_version()
    with tempfile.TemporaryDirectory() as tmp:
        info = npm_pack(f"{args.package}@{version}", Path(tmp))
        tgz = Path(tmp) / info["filename"]
        check_integrity(tgz, info["integrity"])
        with tarfile.open(tgz) as tar:
            meta = json.load(tar.extractfile("package/package.json"))
            main_js = meta.get("main") or "plotly-cartesian.min.js"
            js = tar.extractfile(f"package/{main_js}").read()
            licence = tar.extractfile("package/LICENSE").read()
    traces = sorted({m.decode() for m in TRACE_RE.findall(js)})
    if "scatter" not in traces:
        sys.exit("refresh_plotly: no trace modules found in the bundle; has its format changed?")
    gz = gzip.compress(js, compresslevel=9, mtime=0)
    ASSETS.mkdir(parents=True, exist_ok=True)
    (ASSETS / "plotly-cartesian.min.js.gz").write_bytes(gz)
    (ASSETS / "plotly-LICENSE.txt").write_bytes(licence)
    manifest = {
        "package": args.package, "version": meta["version"], "license": meta.get("license", ""),
        "registry_integrity": info["integrity"], "file": main_js, "sha256": hashlib.sha256(js).hexdigest(),
        "bytes": len(js), "gzip_bytes": len(gz), "traces": traces,
    }
    (ASSETS / "plotly.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    print(f"{args.package} {meta['version']} ({meta.get('license')}): {len(js):,} bytes, {len(gz):,} gzipped; "
          f"traces {', '.join(traces)}")


if __name__ == "__main__":
    main()
