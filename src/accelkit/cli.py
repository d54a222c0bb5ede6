"""The ``accelkit`` command. Each sub-command lives in its own module, exposing
``add_arguments(parser)`` and ``run(args) -> int``; they are imported only when used, so
``accelkit --help`` stays fast. A module with ``ACCEPTS_EXTRA_ARGS = True`` gets the
arguments it does not declare in ``args.extra`` (``accelkit upstream`` hands them to pytest)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

#: sub-command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "backends": ("accelkit.commands.backends", "list known backends and whether they can run here"),
    "doctor": ("accelkit.commands.doctor", "check a backend's device handle (exit 1 on errors)"),
    "conformance": ("accelkit.commands.conformance", "run the conformance suite on a backend"),
    "compare": ("accelkit.commands.compare",
                "compare conformance reports: newly failing, newly passing, time changes"),
    "new": ("accelkit.commands.new", "create a vendor backend package from the cuda-like template"),
    "upstream": ("accelkit.commands.upstream",
                 "run PyTorch's own distributed tests on a backend (harness adapted)"),
}


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(
        prog="accelkit", description="Plug an accelerator into PyTorch distributed and prove it works.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers = {name: sub.add_parser(name, help=text, description=text)
                  for name, (_, text) in COMMANDS.items()}
    return parser, subparsers


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser, subparsers = build_parser()
    command = next((a for a in argv if not a.startswith("-")), None)
    if command in COMMANDS:
        module = importlib.import_module(COMMANDS[command][0])
        module.add_arguments(subparsers[command])
    if command in COMMANDS and getattr(module, "ACCEPTS_EXTRA_ARGS", False):
        args, args.extra = parser.parse_known_args(argv)
    else:
        args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        status = int(module.run(args) or 0)
        sys.stdout.flush()  # a short output still sits in the buffer: fail here, not at exit
        return status
    except BrokenPipeError:  # `accelkit ... | head`: the reader went away
        return _stdout_closed()


#: The exit status of a command whose output reader went away (128 + SIGPIPE, as a shell
#: reports a tool SIGPIPE ended).
EXIT_PIPE_CLOSED = 141


def _stdout_closed() -> int:
    """Point stdout at /dev/null so the interpreter's last flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_PIPE_CLOSED
