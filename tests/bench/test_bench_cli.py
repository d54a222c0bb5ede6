"""The benchmarks refuse bad options before starting any rank process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "collectives.py"
TRAINING = BENCH.parent / "training.py"


def test_zero_rounds_is_refused_with_the_reason():
    proc = subprocess.run([sys.executable, str(BENCH), "--rounds", "0"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert "--rounds must be at least 1 (the median of the rounds is reported), got 0" in proc.stderr


def test_training_bench_refuses_bad_options_before_starting_ranks():
    for argv, message in ((["--steps", "0"], "--steps must be at least 1, got 0"),
                          (["--ranks", "6"], "--ranks must be a multiple of 4"),
                          (["--ranks", "8"], "--layers and --microbatches must be multiples of "
                                             "--ranks (8): the pipeline has one stage per rank"),
                          (["--ranks", "8", "--layers", "8", "--microbatches", "8", "--heads", "6"],
                           "--heads, --vocab and --hidden must be multiples of the TP size 4")):
        proc = subprocess.run([sys.executable, str(TRAINING), *argv], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 2 and message in proc.stderr, (argv, proc.stderr)


def test_hosts_that_do_not_divide_the_ranks_are_refused_before_starting_ranks():
    proc = subprocess.run([sys.executable, str(BENCH), "--hosts", "3"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert "--hosts must be at least 1 and divide --ranks (4), got 3" in proc.stderr


def test_training_bench_refuses_unknown_layouts_and_a_subset_that_would_rewrite_the_readme():
    for argv, message in ((["--layouts", "fsdp2,fsdp3"],
                           "--layouts: unknown fsdp3; choose from fsdp2, fsdp2_tp, pp, pp_fsdp2_tp"),
                          (["--layouts", "fsdp2"], "--layouts with a subset of the layouts needs "
                                                   "--no-readme")):
        proc = subprocess.run([sys.executable, str(TRAINING), *argv], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 2 and message in proc.stderr, (argv, proc.stderr)


def test_driver_bench_refuses_bad_options_and_an_unknown_reference_before_measuring():
    driver = BENCH.parent / "driver.py"
    proc = subprocess.run([sys.executable, str(driver), "--calls", "0"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "--calls must be at least 1, got 0" in proc.stderr, proc.stderr
    proc = subprocess.run([sys.executable, str(driver), "--reference", "no-such-commit"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "--reference no-such-commit: not a commit of" in proc.stderr, proc.stderr
