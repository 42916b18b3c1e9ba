"""Detectors: pure functions of the rule Context and params, one module per root cause.

A detector returns zero or more `Hit`s; it never changes the Context (notes travel in the hit).
Rules (patterns/rules) name detectors by function name through the `DETECTORS` registry.
"""

from __future__ import annotations

# importing the modules registers their detectors
from ncclforensics.rules.detectors import (  # noqa: F401  (registration)
    checkpoint_save,
    dataloader_abort,
    evidence,
    gpu_hardware,
    launch_config,
    network_init,
    network_runtime,
    oom,
    rank_crash,
    rank_divergence,
)
from ncclforensics.rules.detectors.common import DETECTORS, Hit, detector

__all__ = ["DETECTORS", "Hit", "detector"]
