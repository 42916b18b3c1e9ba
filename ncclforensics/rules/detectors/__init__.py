"""Detectors: pure functions of the rule Context (with a rule's params), one module per root cause.

A detector returns zero or more `Hit`s; it never changes the Context (notes travel in the hit).
Rules (patterns/rules) name detectors by function name through the `DETECTORS` registry, which
every module of this package fills on import (a new root cause's module needs no line here).
"""

from __future__ import annotations

import importlib
import pkgutil

from ncclforensics.rules.detectors.common import DETECTORS, Hit, detector

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")

__all__ = ["DETECTORS", "Hit", "detector"]
