"""The conformance catalogue, one module per area. :func:`load_all` imports every area
module so that their ``@check`` definitions land in :data:`accelkit.conformance.CHECKS`."""

import importlib
import pkgutil


def load_all() -> None:
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")
