"""Sub-commands of the ``accelkit`` CLI (see :mod:`accelkit.cli`)."""
