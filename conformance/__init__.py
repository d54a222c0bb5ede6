"""accelkit.conformance: checks that DeviceMesh, DTensor, the RNG tracker,
``parallelize_module``, collectives and checkpointing work on a backend, across real
processes, with per-feature reports. Checks live in :mod:`accelkit.conformance.checks`.
"""

from accelkit.conformance.api import CHECKS, CheckContext, CheckDef, Skip, check

__all__ = ["CHECKS", "CheckContext", "CheckDef", "Skip", "check"]
