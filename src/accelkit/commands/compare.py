"""``accelkit compare A.json B.json [C.json ...]``: conformance reports side by side (what
:mod:`accelkit.conformance.reports.compare` finds, as text, Markdown or JSON). Exit status: 0, or
1 when a later report newly fails a check (CI gating; with ``--same``, when any check's outcome
differs or a check is in one report only), or 2 when a file is not a report."""

from __future__ import annotations

import argparse
import json
import sys

from accelkit.conformance.reports.compare import (
    DEFAULT_TOP,
    compare,
    label,
    to_json,
    to_markdown,
    to_text,
)
from accelkit.conformance.reports.files import read_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("reports", nargs="+", metavar="REPORT",
                        help="report.json files; the first is the baseline")
    parser.add_argument("--format", choices=("text", "markdown", "json"), default="text",
                        help="output format (default: text)")
    parser.add_argument("--output", metavar="FILE", help="write there instead of stdout")
    parser.add_argument("--top", type=int, default=DEFAULT_TOP, metavar="N",
                        help=f"how many of the biggest time changes to list (default {DEFAULT_TOP})")
    parser.add_argument("--same", action="store_true",
                        help="exit 1 when anything but time differs (an outcome, or a check in one "
                             "report only), not only on a regression: a refactoring changes nothing")


def run(args: argparse.Namespace) -> int:
    if len(args.reports) < 2:
        print("accelkit compare: give at least two report.json files (the first is the "
              "baseline)", file=sys.stderr)
        return 2
    try:
        reports = [read_json(path) for path in args.reports]
    except ValueError as exc:
        print(f"accelkit compare: {exc}", file=sys.stderr)
        return 2
    labels = [label(r, path) for r, path in zip(reports, args.reports, strict=True)]
    comparisons = [compare(reports[0], other, names=(labels[0], label), top=args.top)
                   for other, label in zip(reports[1:], labels[1:], strict=True)]
    if args.format == "json":
        text = json.dumps(to_json(comparisons), indent=2) + "\n"
    elif args.format == "markdown":
        text = to_markdown(comparisons, reports)
    else:
        text = to_text(comparisons)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    if args.same:
        return 0 if all(c.same for c in comparisons) else 1
    return 1 if any(c.regressed for c in comparisons) else 0
