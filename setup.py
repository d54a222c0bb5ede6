"""Package layout: ``src/accelkit`` is the package (under src/ so that running from the repo
root never shadows the installed one); the top-level folders become its sub-packages.

``core/`` -> ``accelkit.core``, ``backends/`` -> ``accelkit.backends``,
``conformance/`` -> ``accelkit.conformance``, ``device_templates/`` ->
``accelkit.device_templates`` (shipped as data: C++ sources, headers, TOML, templates).
"""

from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).parent
FOLDERS = {
    "accelkit": "src/accelkit",
    "accelkit.core": "core",
    "accelkit.backends": "backends",
    "accelkit.conformance": "conformance",
    "accelkit.device_templates": "device_templates",
}
DATA = ["*.h", "*.hpp", "*.cpp", "*.toml", "*.md", "*.tmpl", "*.txt", "*.in", "*.ini", "*.cfg"]


def _packages():
    packages, package_dir, package_data = [], {}, {}
    for name, folder in FOLDERS.items():
        package_dir[name] = folder
        root = ROOT / folder
        for sub in [root, *sorted(p for p in root.rglob("*") if p.is_dir())]:
            if "__pycache__" in sub.parts or sub.name.startswith("."):
                continue
            rel = sub.relative_to(root)
            if (sub / "__init__.py").exists() or sub == root:
                pkg = ".".join([name, *rel.parts]) if rel.parts else name
                packages.append(pkg)
                package_data[pkg] = DATA + [f"{d.relative_to(sub)}/**/*" for d in sub.iterdir()
                                            if d.is_dir() and not (d / "__init__.py").exists()
                                            and d.name != "__pycache__"]
    return packages, package_dir, package_data


packages, package_dir, package_data = _packages()
setup(packages=packages, package_dir=package_dir, package_data=package_data,
      include_package_data=True)
