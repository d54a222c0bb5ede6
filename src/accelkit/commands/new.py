"""``accelkit new NAME [--dir DIR] [--collective-backend CNAME]``: create the vendor backend
package ``torch_NAME`` from the cuda-like template.

The package builds ahead of time against the installed torch and accelkit's C++ layer, loads
at ``import torch``, and passes the conformance suite like accelkit's mock on day one; its
README and accelkit's docs/porting.md say how to replace the host-memory parts with a driver.
NAME must be a lower-case Python identifier (it becomes ``torch.NAME``, the device string
``NAME:0`` and the package ``torch_NAME``) that torch does not use. Exit 0 when written, 2 on
bad input (nothing written). Rendering: :mod:`accelkit.device_templates.render`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME",
                        help="device name, a lower-case identifier (e.g. myaccel): "
                             "torch.NAME, torch.device('NAME:0'), package torch_NAME")
    parser.add_argument("--dir", type=Path, metavar="DIR",
                        help="where to write the package: a new or empty directory "
                             "(default: ./torch_NAME)")
    parser.add_argument("--collective-backend", dest="cname", metavar="CNAME",
                        help="name of the device's collective library, the c10d backend "
                             "(default: NAMEccl)")


def run(args: argparse.Namespace) -> int:
    from accelkit.device_templates.render import TemplateError, create_package

    try:
        names, dest, written = create_package(args.name, args.dir, args.cname)
    except TemplateError as exc:
        print(f"accelkit new: {exc}", file=sys.stderr)
        return 2
    print(f"created {names.package} in {dest} ({len(written)} files): device {names.name!r}, "
          f"collective backend {names.cname!r}")
    print("next steps:")
    print(f"  pip install --no-build-isolation {dest}     # compiles the C++ (a few minutes)")
    print(f"  accelkit conformance --backend {names.name} --world-size 4")
    print(f"  then port it to your driver: {dest / 'README.md'}")
    return 0
