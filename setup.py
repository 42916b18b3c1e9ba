"""Which files the wheel holds; everything else about the package is in pyproject.toml.

patterns/ stays at the top of the repository (DESIGN.md) and ships inside the package as
ncclforensics/patterns: a mapped folder is out of reach of pyproject's `packages.find`, hence this
file. parse/signatures.py finds the catalogue in either place.
"""

from setuptools import find_namespace_packages, setup

PATTERNS = "ncclforensics.patterns"
NOT_PACKAGES = ["__pycache__", "*.__pycache__"]

setup(
    packages=[
        "ncclforensics",
        *(f"ncclforensics.{p}" for p in find_namespace_packages("ncclforensics", exclude=NOT_PACKAGES)),
        PATTERNS,
        *(f"{PATTERNS}.{p}" for p in find_namespace_packages("patterns", exclude=NOT_PACKAGES)),
    ],
    package_dir={PATTERNS: "patterns"},
    # report/assets: the vendored plotly.js bundle (gzip), its manifest and licence (tools/refresh_plotly.py)
    package_data={"": ["*.toml", "*.txt", "*.j2", "*.css", "*.js"], "ncclforensics": ["report/assets/*"]},
)
