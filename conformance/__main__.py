"""``python -m accelkit.conformance``: the torchrun mode (see :mod:`accelkit.conformance.launchers.torchrun`)."""

import sys

from accelkit.conformance.launchers.torchrun import main

sys.exit(main())
