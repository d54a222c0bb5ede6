"""bench/collectives.py refuses bad options before starting any rank process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "collectives.py"


def test_zero_rounds_is_refused_with_the_reason():
    proc = subprocess.run([sys.executable, str(BENCH), "--rounds", "0"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert "--rounds must be at least 1 (the median of the rounds is reported), got 0" in proc.stderr
