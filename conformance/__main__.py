"""``python -m accelkit.conformance``: the torchrun mode (see :mod:`accelkit.conformance.torchrun`)."""

import sys

from accelkit.conformance.torchrun import main

sys.exit(main())
