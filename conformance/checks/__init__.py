"""The conformance catalogue, one module per area: ``<area>.py`` holds the checks whose ids
start with ``<area>.`` (see :mod:`accelkit.conformance.api`). :func:`load_all` imports every
area module so that their checks land in :data:`accelkit.conformance.api.CHECKS`."""

import importlib
import pkgutil


def load_all() -> list[str]:
    """Import every area module; their names."""
    names = [f"{__name__}.{info.name}" for info in pkgutil.iter_modules(__path__)
             if not info.name.startswith("_")]
    for name in names:
        importlib.import_module(name)
    return names
