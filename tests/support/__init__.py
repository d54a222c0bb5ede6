"""What accelkit's tests share, importable as ``support`` from any test and from the processes
they start (tests/conftest.py puts ``tests/`` on the path of both):

- :mod:`support.python`: run a snippet in a fresh interpreter and read its JSON result;
- :mod:`support.ranks`: build the mock's extensions once and start a script's rank processes
  (bench/ starts its ranks with it too);
- :mod:`support.mock_process`: the ``mock_process`` marker, for modules that run inside the mock;
- :mod:`support.markers`: which modules are slow, multi-process, C++ builds or use network
  namespaces, as markers to select by (``pytest -m "not slow"``);
- :mod:`support.pydevice`: a Python device module to register, and break, in a snippet.
"""

from pathlib import Path

#: The tests' root folder, ``tests/``.
TESTS = Path(__file__).resolve().parent.parent
#: The repository's root.
ROOT = TESTS.parent
