"""accelkit upstream's start-up hook. This folder is on PYTHONPATH only in the processes of an
``accelkit upstream`` run; Python imports this module at interpreter start, before any test
code. It installs :mod:`accelkit.conformance.upstream.hook`, then runs the ``sitecustomize``
it shadows, if there is one."""

import importlib.machinery
import importlib.util
import os
import sys

if os.environ.get("ACCELKIT_UPSTREAM"):
    from accelkit.conformance.upstream import hook

    hook.install_from_env()

_here = os.path.dirname(os.path.abspath(__file__))
_rest = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
if _spec is not None and _spec.loader is not None:
    _shadowed = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_shadowed)
