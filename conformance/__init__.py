"""accelkit.conformance: checks that DeviceMesh, DTensor, the RNG tracker,
``parallelize_module``, collectives and checkpointing work on a backend, across real
processes, with per-feature reports. Checks live in :mod:`accelkit.conformance.checks`.

Its parts, a sub-package each (docs/architecture.md has the map):

- the vocabulary a check and a report share: :mod:`~accelkit.conformance.api` (``@check``,
  ``CheckContext``), :mod:`~accelkit.conformance.outcomes` (outcomes, rank statuses, result
  records), :mod:`~accelkit.conformance.model` (``RunReport``);
- :mod:`accelkit.conformance.engine`: options, session, loader, expectations, plan, runner,
  verdict (the one place a check's result is decided), execute (one check on one rank);
- :mod:`accelkit.conformance.launchers`: the worker pool and its workers, torchrun, simulated
  ranks, simulated hosts (Linux namespaces), process helpers;
- :mod:`accelkit.conformance.reports`: terminal, report files, compare, coverage;
- entry points: ``accelkit conformance`` (:mod:`accelkit.commands.conformance`),
  :mod:`~accelkit.conformance.pytest_plugin` (``pytest --accelkit-backend``),
  ``torchrun -m accelkit.conformance`` (:mod:`~accelkit.conformance.launchers.torchrun`).
"""

from accelkit.conformance.api import CHECKS, CheckContext, CheckDef, Defaults, Skip, check

__all__ = ["CHECKS", "CheckContext", "CheckDef", "Defaults", "Skip", "check"]
