"""The vendored plotly.js bundle (report/assets, refreshed by tools/refresh_plotly.py), checked against its manifest."""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ASSETS = Path(__file__).parent / "assets"
GZ_FILE = "plotly-cartesian.min.js.gz"
MANIFEST = "plotly.json"


class BundleError(Exception):
    """The vendored bundle is missing, damaged, or cannot draw a trace type a chart uses."""


@dataclass(frozen=True)
class Bundle:
    package: str
    version: str
    license: str
    sha256: str
    traces: frozenset[str]

    @property
    def asset_name(self) -> str:
        """The shared copy's file name in a scan (versioned: two tool versions never overwrite each other)."""
        return f"plotly-cartesian-{self.version}.min.js"


@functools.cache
def bundle() -> Bundle:
    try:
        m = json.loads((ASSETS / MANIFEST).read_text(encoding="utf-8"))
        return Bundle(package=m["package"], version=m["version"], license=m.get("license", ""), sha256=m["sha256"],
                      traces=frozenset(m["traces"]))
    except (OSError, ValueError, KeyError) as exc:
        raise BundleError(f"vendored plotly.js manifest unreadable ({exc}); run tools/refresh_plotly.py") from None


@functools.cache
def gzipped() -> bytes:
    try:
        return (ASSETS / GZ_FILE).read_bytes()
    except OSError as exc:
        raise BundleError(f"vendored plotly.js missing ({exc}); run tools/refresh_plotly.py") from None


@functools.cache
def gzipped_base64() -> str:
    """What a self-contained report inlines: the browser's DecompressionStream unpacks it offline."""
    return base64.b64encode(gzipped()).decode("ascii")


@functools.cache
def plain_js() -> str:
    """The bundle as plain JavaScript (a scan's shared asset file), checked against the manifest."""
    data = gzip.decompress(gzipped())
    if hashlib.sha256(data).hexdigest() != bundle().sha256:
        raise BundleError("vendored plotly.js does not match its manifest's sha256; run tools/refresh_plotly.py")
    return data.decode("utf-8")


def check_traces(types: Iterable[str]) -> None:
    """Raise BundleError when a chart uses a trace type the vendored bundle does not register."""
    b = bundle()
    missing = sorted(set(types) - b.traces)
    if missing:
        raise BundleError(f"chart trace type(s) {', '.join(missing)} not in the vendored {b.package} {b.version} "
                          f"(it draws {', '.join(sorted(b.traces))}); choose a bundle that does in "
                          "tools/refresh_plotly.py")
