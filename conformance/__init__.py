"""accelkit.conformance: checks that DeviceMesh, DTensor, the RNG tracker,
``parallelize_module``, collectives and checkpointing work on a backend, across real
processes, with per-feature reports. Checks live in :mod:`accelkit.conformance.checks`.

The engine, one module per job:

- :mod:`~accelkit.conformance.api`: how a check is written (``@check``, ``CHECK_DEFAULTS``,
  ``CheckContext``);
- :mod:`~accelkit.conformance.loader`: finding checks (catalogue, extra modules) and selection;
- :mod:`~accelkit.conformance.options`: the options of a run, declared once for the CLI, the
  pytest plugin and the torchrun mode; :mod:`~accelkit.conformance.session`: the backend, the
  checks and the expectations they name;
- :mod:`~accelkit.conformance.expectations`: the per-backend TOML of known failures;
- :mod:`~accelkit.conformance.plan`: checks x world sizes x expectations -> what runs where;
- :mod:`~accelkit.conformance.pool` / :mod:`~accelkit.conformance.worker`: the long-lived rank
  processes and their command loop; :mod:`~accelkit.conformance.execute`: one check on one rank
  from a clean state;
- :mod:`~accelkit.conformance.outcomes`: outcomes, rank statuses and the result records;
- :mod:`~accelkit.conformance.verdict`: the one place a check's result is decided;
- :mod:`~accelkit.conformance.runner`: executes a plan on worker pools;
- :mod:`~accelkit.conformance.model`: the record of a run (``RunReport``);
- :mod:`~accelkit.conformance.terminal` / :mod:`~accelkit.conformance.reports`: progress,
  summary, ``report.json`` / ``junit.xml`` / ``report.md``;
  :mod:`~accelkit.conformance.compare`: two or more reports side by side;
- entry points: :mod:`~accelkit.conformance.cli` (``accelkit conformance``),
  :mod:`~accelkit.conformance.pytest_plugin` (``pytest --accelkit-backend``),
  :mod:`~accelkit.conformance.torchrun` (``torchrun -m accelkit.conformance``);
- :mod:`~accelkit.conformance.hosts`: simulated hosts on one machine (Linux namespaces), for
  proving a launch across hosts (``tests/test_two_hosts.py``).
"""

from accelkit.conformance.api import CHECKS, CheckContext, CheckDef, Defaults, Skip, check

__all__ = ["CHECKS", "CheckContext", "CheckDef", "Defaults", "Skip", "check"]
