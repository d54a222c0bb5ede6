"""What the benchmarks that regenerate a section of bench/README.md share: the environment a
run records with its raw results, and replacing the script's section between its markers."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
README = HERE / "README.md"


def environment() -> dict:
    """The commit, torch version, load average, CPU count and date of a run (``load_after`` is
    the caller's to add when it ends)."""
    import torch

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, text=True,
                            capture_output=True).stdout.strip()
    return {"commit": commit or None, "torch": torch.__version__, "load_before": os.getloadavg(),
            "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def write_section(section: str, begin: str, end: str, heading: str) -> None:
    """Replace the text between ``begin`` and ``end`` in bench/README.md by ``section`` (which
    holds both markers), or append it under ``## heading`` the first time."""
    text = README.read_text()
    if begin in text:
        head, rest = text.split(begin, 1)
        text = head + section + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + f"\n\n## {heading}\n\n" + section + "\n"
    README.write_text(text)
