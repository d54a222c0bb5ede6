"""``accelkit new``: input validation (message text, nothing written) and what it renders,
without building (the build and conformance run are in test_templates.py)."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest
from accelkit.device_templates import render

from accelkit.cli import main

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CORE_HEADERS = Path(render.__file__).resolve().parent.parent / "core" / "include" / "accelkit"


def _new(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["new", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(("name", "message"), [
    ("My-Dev", "device name 'My-Dev' is not valid: use a lower-case Python identifier"),
    ("Demo", "device name 'Demo' is not valid: use a lower-case Python identifier"),
    ("1accel", "device name '1accel' is not valid"),
    ("cuda", "device name 'cuda' is a device type built into torch"),
    ("xpu", "device name 'xpu' is a device type built into torch"),
    ("privateuseone", "device name 'privateuseone' is a device type built into torch"),
    ("meta", "device name 'meta' is a device type built into torch"),
    ("mock", "device name 'mock' is accelkit's own reference device"),
    ("nn", "device name 'nn' is already an attribute of torch (torch.nn)"),
    ("lambda", "device name 'lambda' is a Python keyword"),
    ("to", "device name 'to' clashes with torch.Tensor.to, torch.nn.Module.to, "
           "PackedSequence.to: torch adds Tensor.to(), Tensor.is_to and Module.to() for the "
           "device"),
    ("leaf", "device name 'leaf' clashes with torch.Tensor.is_leaf"),
    ("train", "device name 'train' clashes with torch.nn.Module.train"),
])
def test_bad_device_name(tmp_path, capsys, name, message):
    dest = tmp_path / "out"
    code, out, err = _new(capsys, name, "--dir", str(dest))
    assert code == 2
    assert err.startswith("accelkit new: ")
    assert message in err
    assert out == ""
    assert not dest.exists()


@pytest.mark.parametrize(("cname", "message"), [
    ("nccl", "collective backend name 'nccl' is taken by torch or accelkit"),
    ("gloo", "collective backend name 'gloo' is taken by torch or accelkit"),
    ("mpi", "collective backend name 'mpi' is taken"),
    ("ucc", "collective backend name 'ucc' is taken"),
    ("xccl", "collective backend name 'xccl' is taken"),
    ("mockccl", "collective backend name 'mockccl' is taken"),
    ("mccl", "collective backend name 'mccl' is taken"),
    ("Bad-CCL", "collective backend name 'Bad-CCL' is not valid: use a lower-case Python "
                "identifier"),
    ("demo", "collective backend name 'demo' equals the device name"),
    ("std", "collective backend name 'std' is reserved: it becomes a C++ namespace"),
    ("class", "collective backend name 'class' is reserved"),
])
def test_bad_collective_name(tmp_path, capsys, cname, message):
    dest = tmp_path / "out"
    code, _, err = _new(capsys, "demo", "--dir", str(dest), "--collective-backend", cname)
    assert code == 2
    assert message in err
    assert "e.g. 'democcl'" in err
    assert not dest.exists()


def test_directory_not_empty(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    code, _, err = _new(capsys, "demo", "--dir", str(tmp_path))
    assert code == 2
    assert f"directory {tmp_path} is not empty (1 entries: notes.txt)" in err
    assert "pass another --dir" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_directory_is_a_file(tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("x")
    code, _, err = _new(capsys, "demo", "--dir", str(target))
    assert code == 2
    assert f"{target} exists and is not a directory" in err
    assert target.read_text() == "x"


def test_directory_below_a_file(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    dest = blocker / "pkg"
    code, _, err = _new(capsys, "demo", "--dir", str(dest))
    assert code == 2
    assert f"accelkit new: cannot write {dest}/.gitignore: Not a directory; 0 of 28 files " \
           f"were written to {dest}" in err
    assert blocker.read_text() == "x"


def test_default_directory_and_files(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = _new(capsys, "demo")
    assert code == 0, err
    dest = tmp_path / "torch_demo"
    assert f"created torch_demo in {dest} (28 files): device 'demo', collective backend " \
           "'democcl'" in out
    files = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert files == [
        ".gitignore", "MANIFEST.in", "README.md",
        "csrc/demo_device.cpp", "csrc/demo_runtime.h", "csrc/democcl.cpp",
        "csrc/democcl_collectives.cpp", "csrc/democcl_hosts.cpp", "csrc/democcl_hosts.h",
        "csrc/democcl_net.cpp", "csrc/democcl_net.h", "csrc/democcl_p2p.cpp",
        "csrc/democcl_reduce.h", "csrc/democcl_shm.h", "csrc/democcl_staging.h",
        "csrc/democcl_sync.cpp", "csrc/democcl_wire.h",
        "csrc/driver/demort.cpp", "csrc/driver/demort.h", "csrc/driver/scheduler.h",
        "csrc/kernels/binary_ops.cpp",
        "pyproject.toml", "setup.py",
        "src/torch_demo/__init__.py", "src/torch_demo/conformance_expectations.toml",
        "src/torch_demo/democcl.py", "src/torch_demo_spec.py", "tox.ini"]


def test_rendered_package(tmp_path, capsys):
    dest = tmp_path / "pkg"
    code, _, err = _new(capsys, "demo", "--dir", str(dest), "--collective-backend", "dccl")
    assert code == 0, err
    texts = {p.relative_to(dest).as_posix(): p.read_text() for p in dest.rglob("*")
             if p.is_file()}
    for rel, text in texts.items():
        assert "${" not in text, f"unrendered placeholder in {rel}"
        if rel.endswith(".py"):
            ast.parse(text, rel)
    # The vendor-replaceable parts are the mock's, renamed: nothing of mock/mockccl is left
    # (dccl.py's docstring says where it comes from).
    for rel in ("csrc/demo_runtime.h", "csrc/demo_device.cpp", "csrc/dccl.cpp",
                "csrc/driver/demort.h", "csrc/driver/demort.cpp", "csrc/driver/scheduler.h",
                "csrc/dccl_shm.h", "csrc/dccl_reduce.h", "csrc/kernels/binary_ops.cpp"):
        assert not re.search("(?i)mock|mockccl", texts[rel]), rel
    assert not re.search("(?i)mock|mockccl", texts["src/torch_demo/dccl.py"].split('"""', 2)[2])
    assert "class DemoRuntime final : public accelkit::Runtime" in texts["csrc/demo_runtime.h"]
    # The adapter calls the driver skeleton, which reads the device's settings.
    assert '#include "driver/demort.h"' in texts["csrc/demo_runtime.h"]
    assert "demoStreamCreateWithPriority(&stream, priority)" in texts["csrc/demo_runtime.h"]
    assert 'std::getenv("DEMO_DEVICES")' in texts["csrc/driver/demort.cpp"]
    assert '#include "demo_runtime.h"' in texts["csrc/demo_device.cpp"]
    assert "accelkit::register_device(*runtime, \"the demo device\");" in \
        texts["csrc/demo_device.cpp"]
    assert "#include <accelkit/accelkit.h>" in texts["csrc/kernels/binary_ops.cpp"]
    assert "ACCELKIT_FALLBACK(add_Tensor, self, other, alpha)" in \
        texts["csrc/kernels/binary_ops.cpp"]
    assert "#include <accelkit/c10d/backend.h>" in texts["csrc/dccl.cpp"]
    assert '"/dccl_"' in texts["csrc/dccl.cpp"]  # the /dev/shm segment prefix
    assert "from torch_demo import _dccl" in texts["src/torch_demo/dccl.py"]
    assert "load_extension" not in texts["src/torch_demo/dccl.py"]
    # accelkit's C++ layer and device-module builder are used, not copied.
    copied = {Path(rel).name for rel in texts} & {p.name for p in CORE_HEADERS.rglob("*.h")}
    assert not copied
    assert "include_dirs=INCLUDE_DIRS" in texts["setup.py"]
    assert "INCLUDE_DIRS = [include_dir()]" in texts["setup.py"]
    assert ("CppExtension(\"torch_demo._C\", [\"csrc/demo_device.cpp\", \"csrc/driver/demort.cpp\"] + "
            "sorted(glob(\"csrc/kernels/*.cpp\"))") in texts["setup.py"]
    assert "extra_objects=ACCELKIT" in texts["setup.py"]
    assert 'os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"' in texts["setup.py"]
    assert ("CppExtension(\"torch_demo._dccl\", [\"csrc/dccl.cpp\", \"csrc/dccl_collectives.cpp\", "
            "\"csrc/dccl_hosts.cpp\", \"csrc/dccl_net.cpp\", \"csrc/dccl_p2p.cpp\", "
            "\"csrc/dccl_sync.cpp\"]") in texts["setup.py"]
    init = texts["src/torch_demo/__init__.py"]
    assert "device_module = build_device_module(DEVICE_NAME, _C)" in init
    assert 'COLLECTIVE_BACKEND = "dccl"' in init
    assert "creator=dccl.create_backend" in init
    assert "INDUCTOR = HostKernels(DEVICE_NAME)" in init and "inductor=INDUCTOR" in init
    assert "cpu_collectives=True, inductor=True)" in texts["src/torch_demo_spec.py"]

    pyproject = tomllib.loads(texts["pyproject.toml"])
    assert pyproject["build-system"]["requires"] == ["setuptools>=70.1", "torch", "accelkit"]
    assert pyproject["project"]["name"] == "torch_demo"
    eps = pyproject["project"]["entry-points"]
    assert eps["torch.backends"] == {"demo": "torch_demo:_autoload"}
    assert eps["accelkit.backends"] == {"demo": "torch_demo_spec:SPEC"}
    assert "[testenv:conformance]" in texts["tox.ini"]
    assert "accelkit conformance --backend demo --world-size 4" in texts["tox.ini"]
    assert "pip install --no-build-isolation ." in texts["README.md"]


def test_tox_env_installs_this_torch_and_this_accelkit(tmp_path, capsys):
    """An unpinned torch would pull another (multi-GB) build, and accelkit may be unreleased:
    the generated tox.ini pins the torch accelkit new ran with and points at this accelkit."""
    import configparser
    import importlib.metadata
    from urllib.parse import urlparse

    import torch

    dest = tmp_path / "pkg"
    assert _new(capsys, "demo", "--dir", str(dest))[0] == 0
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(dest / "tox.ini")
    deps = [line.strip() for line in cfg["testenv:conformance"]["deps"].splitlines() if line.strip()]
    assert deps[0] == f"torch=={torch.__version__.split('+')[0]}", deps
    if deps[1].startswith("accelkit @ "):
        # a checkout: named relative to the package (no path of this machine in the file)
        url = deps[1].removeprefix("accelkit @ ")
        assert url.startswith("file://{toxinidir}/"), deps
        source = (dest / urlparse(url).path.removeprefix("{toxinidir}/")).resolve()
        assert (source / "pyproject.toml").is_file() and (source / "src" / "accelkit").is_dir(), deps
    else:
        assert deps[1] == f"accelkit=={importlib.metadata.version('accelkit')}", deps


def test_generated_package_has_a_gitignore_and_no_path_of_this_machine(tmp_path, capsys):
    dest = tmp_path / "pkg"
    assert _new(capsys, "demo", "--dir", str(dest))[0] == 0
    ignored = (dest / ".gitignore").read_text().split()
    assert {"build/", "dist/", "*.egg-info/", "__pycache__/", ".tox/", "reports/", "*.so"} <= set(ignored)
    checkout = str(Path(__file__).resolve().parents[2])
    for path in dest.rglob("*"):
        if path.is_file():
            text = path.read_text()
            assert f"file://{checkout}" not in text and str(tmp_path) not in text, path


def test_expectations_file_is_empty_and_valid(tmp_path, capsys):
    """As generated, the package expects every check and every op to pass: its expectations
    file holds comments only, and loads."""
    from accelkit.conformance.checks._opinfo import op_names
    from accelkit.conformance.engine.expectations import load, load_ops

    code, _, err = _new(capsys, "demo", "--dir", str(tmp_path / "pkg"))
    assert code == 0, err
    path = tmp_path / "pkg" / "src" / "torch_demo" / "conformance_expectations.toml"
    assert tomllib.loads(path.read_text()) == {}
    assert load(path, set(), "2.13.0") == {}
    assert load_ops(path, op_names(), "2.13.0") == {}


def test_expectations_file_example_is_valid_for_the_catalogue(tmp_path, capsys):
    """The commented example in the generated expectations file, uncommented, loads against
    the catalogue: it names checks that exist, in the format the file documents."""
    from accelkit.conformance.engine import loader
    from accelkit.conformance.engine.expectations import load

    code, _, err = _new(capsys, "demo", "--dir", str(tmp_path / "pkg"))
    assert code == 0, err
    text = (tmp_path / "pkg" / "src" / "torch_demo" / "conformance_expectations.toml").read_text()
    example = text[text.index("For example:"):].split("\n", 1)[1].split("\n\n", 1)[0]
    uncommented = tmp_path / "example.toml"
    uncommented.write_text("\n".join(line.removeprefix("#").removeprefix(" ")
                                     for line in example.splitlines()))
    loaded = load(uncommented, loader.load([]), "2.13.0")
    assert sorted(loaded) == ["collectives.all_reduce_64mib@8", "rng.offset_exact"]
    from accelkit.conformance.checks._opinfo import op_names
    from accelkit.conformance.engine.expectations import load_ops

    assert sorted(load_ops(uncommented, op_names(), "2.13.0")) == ["linalg.eigh"]


def test_name_containing_mock_renders_once(tmp_path, capsys):
    """Rendering replaces the mock's names in one pass: a device called 'mockup' is not
    rendered again into 'mockupup'."""
    code, _, err = _new(capsys, "mockup", "--dir", str(tmp_path / "pkg"))
    assert code == 0, err
    runtime = (tmp_path / "pkg" / "csrc" / "mockup_runtime.h").read_text()
    assert "namespace torch_mockup {" in runtime
    assert "mockupup" not in runtime
    assert (tmp_path / "pkg" / "src" / "torch_mockup" / "mockupccl.py").exists()


def test_uncovered_mock_name_stops_rendering():
    """A spelling of the mock's name no token covers is an error naming file and line, so the
    mock cannot grow a name the template would leak."""
    names = render.Names.create("demo")
    with pytest.raises(render.TemplateError,
                       match=r"backends/mock/x\.h:2: 'MoCk' is not covered by the renderer's "
                             r"tokens"):
        render._substitute("// ok\n// MoCk device\n", names, "backends/mock/x.h")


def test_missing_override_target_stops_rendering():
    with pytest.raises(render.TemplateError,
                       match=r"mockccl\.py has no top-level extension, which the renderer replaces"):
        render._override("x = 1\n", {"extension": "def extension(): pass"}, "mockccl.py")


def test_porting_guide_names_existing_checks():
    """Every check id docs/porting.md cites is in the catalogue (no stale references)."""
    from accelkit.conformance.api import CHECKS
    from accelkit.conformance.checks import load_all

    load_all()
    guide = (Path(__file__).resolve().parents[2] / "docs" / "porting.md").read_text()
    areas = {check_id.split(".")[0] for check_id in CHECKS}
    pattern = "`((?:" + "|".join(sorted(areas)) + r")\.[a-z0-9_]+)`"
    cited = set(re.findall(pattern, guide))
    assert cited, "the guide cites no check"
    assert not cited - set(CHECKS), f"unknown check ids in docs/porting.md: {cited - set(CHECKS)}"


def test_generated_spec_reports_its_device_mode_and_no_device(tmp_path, capsys, monkeypatch):
    """The generated spec's settings (a report's settings row) name every device-mode switch
    with its default, set or not; with 0 devices it is unavailable, saying why."""
    import importlib.util

    dest = tmp_path / "pkg"
    code, _, err = _new(capsys, "demo", "--dir", str(dest))
    assert code == 0, err
    path = dest / "src" / "torch_demo_spec.py"
    module_spec = importlib.util.spec_from_file_location("torch_demo_spec_probe", path)
    spec_module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(spec_module)
    for var in ("DEMO_ASYNC", "DEMO_HOST_ACCESSIBLE", "DEMO_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DEMO_ASYNC", "1")
    settings = spec_module.SPEC.settings()
    assert settings["DEMO_ASYNC"] == "1" and settings["DEMO_HOST_ACCESSIBLE"] == "1"
    assert {"DEMO_DEVICES", "DEMO_MEMORY", "DEMO_LAUNCH_BLOCKING", "DEMOCCL_CHUNK_BYTES"} \
        <= set(settings)
    assert not any("FAULT" in k for k in settings)
    assert settings["build"].startswith("unknown: no _build.json in ")  # rendered, not built
    monkeypatch.setenv("DEMO_DEVICES", "0")
    assert spec_module.SPEC.probe(1) == (False, "the demo runtime reports no devices "
                                                "(DEMO_DEVICES=0)")


def test_porting_guide_counts_are_what_list_prints():
    """The catalogue counts docs/porting.md states (checks run at 2 and at 8 ranks, of all) are
    what `accelkit conformance --list` prints, never typed by hand and left stale. Each listing
    runs in its own process: check modules other tests load stay out of it."""
    import os
    import subprocess

    def listed(*argv: str) -> tuple[int, int]:
        proc = subprocess.run([sys.executable, "-m", "accelkit", "conformance", "--backend", "cpu",
                               "--list", *argv], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
        assert proc.returncode == 0, proc.stderr[-2000:]
        out = proc.stdout
        return (int(re.search(r"^(\d+) check\(s\)$", out, re.MULTILINE).group(1)),
                len(re.findall(r"^left out: ", out, re.MULTILINE)))

    total, _ = listed()
    at_2, left_2 = listed("--world-size", "2")
    at_8, _ = listed("--world-size", "8")
    guide = " ".join((Path(__file__).resolve().parents[2] / "docs" / "porting.md")
                     .read_text().split())
    words = {1: "one", 2: "two", 3: "three", 4: "four"}
    assert (f"runs every check written for 2 ranks ({at_2} of {total}: all but the half-group "
            f"collective, the 3-D mesh, the 3-D training run and the simulated `scale` checks) on 2 ranks, and the "
            f"report names the "
            f"{words.get(left_2, left_2)} it left out; `--world-size 8` runs the {at_8} written "
            "for 8") in guide, (total, at_2, at_8)


def test_build_record_states_the_build_and_marks_it_stale(tmp_path):
    """What a generated package's setup.py records and its reports show: when, how long, which
    sources; STALE once the sources change without a new build being installed."""
    from accelkit.core.cpp import build_record_text, source_hash, write_build_record

    csrc, package = tmp_path / "csrc", tmp_path / "site" / "torch_demo"
    (csrc / "kernels").mkdir(parents=True)
    (csrc / "kernels" / "ops.cpp").write_text("int ok();\n")
    assert build_record_text(package).startswith("unknown: no _build.json in ")
    write_build_record(package, csrc, 312.46)
    text = build_record_text(package)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ in 312\.5 s, sources [0-9a-f]{16}", text)
    assert text.endswith(source_hash(csrc))
    (csrc / "kernels" / "ops.cpp").write_text("int broken(\n")
    assert f"; STALE: {csrc} has changed since (now {source_hash(csrc)})" in build_record_text(package)


def test_the_readme_table_names_every_file_it_renders():
    """The generated README's layout table names each file ``accelkit new`` writes (the kernels
    folder by its pattern), so a file added to the template cannot go unexplained."""
    files = render.render(render.Names.create("npu"))
    table = [line for line in files["README.md"].splitlines() if line.startswith("| `")]
    named = {name for line in table for name in re.findall(r"`([^`]+)`", line.split(" | ")[0])}
    missing = [path for path in files if path != "README.md" and path not in named
               and not (path.startswith("csrc/kernels/") and "csrc/kernels/*.cpp" in named)]
    assert missing == [], f"add these to device_templates/cuda_like/README.md.tmpl's table: {missing}"
    stale = [name for name in named if "*" not in name and name not in files]
    assert stale == [], f"the table names files accelkit new does not write: {stale}"
