"""The backend registry: built-in and third-party backends, discovered through the
``accelkit.backends`` entry-point group (``name = "package.module:SPEC"``).

Discovery only imports the module holding the :class:`BackendSpec`; it never calls
``spec.setup()``, so listing backends claims no device and no PrivateUse1 slot.
"""

from __future__ import annotations

import difflib
from importlib import metadata

from accelkit.core.spec import BackendSpec

ENTRY_POINT_GROUP = "accelkit.backends"

_registered: dict[str, BackendSpec] = {}
_distributions: dict[str, str] = {}
_discovered = False


class BackendRegistryError(Exception):
    """A backend cannot be registered or found; the message says which and how to fix it."""


def register(spec: BackendSpec, *, origin: str | None = None) -> BackendSpec:
    """Add ``spec`` to the registry. Registering the very same spec twice is a no-op;
    another spec under a taken name is an error naming both origins."""
    if not isinstance(spec, BackendSpec):
        raise BackendRegistryError(
            f"register() takes an accelkit.core.BackendSpec, got {type(spec).__name__}")
    origin = origin or spec.origin or "accelkit.core.registry.register()"
    existing = _registered.get(spec.name)
    if existing is not None:
        if existing == spec or existing.origin == origin:
            return existing
        raise BackendRegistryError(
            f"backend name {spec.name!r} is registered twice: by {existing.origin} and by {origin}; "
            "rename one of them (the name is what --backend takes)")
    if spec.origin != origin:
        spec = _with_origin(spec, origin)
    _registered[spec.name] = spec
    return spec


def _with_origin(spec: BackendSpec, origin: str) -> BackendSpec:
    from dataclasses import replace

    return replace(spec, origin=origin)


def _discover() -> None:
    global _discovered
    if _discovered:
        return
    _discovered = True
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist.name if ep.dist is not None else "<unknown distribution>"
        origin = f"entry point {ep.name!r} = {ep.value!r} of distribution {dist!r}"
        try:
            spec = ep.load()
        except Exception as exc:  # the error must name the distribution, whatever failed
            _discovered = False
            raise BackendRegistryError(
                f"backend entry point {ep.name!r} of distribution {dist!r} failed to import "
                f"({ep.value}): {type(exc).__name__}: {exc}") from exc
        if not isinstance(spec, BackendSpec):
            _discovered = False
            raise BackendRegistryError(
                f"{origin} is a {type(spec).__name__}, not an accelkit.core.BackendSpec")
        if spec.name != ep.name:
            _discovered = False
            raise BackendRegistryError(
                f"{origin} declares BackendSpec(name={spec.name!r}); the entry point name must match")
        register(spec, origin=origin)
        if ep.dist is not None:
            _distributions[spec.name] = ep.dist.name


def distribution(name: str) -> str | None:
    """The distribution whose entry point provides backend ``name`` (None when it was
    registered by a call to :func:`register`)."""
    _discover()
    return _distributions.get(name)


def names() -> list[str]:
    """The names of every known backend, sorted."""
    _discover()
    return sorted(_registered)


def get(name: str) -> BackendSpec:
    """The backend called ``name``; an unknown name lists the known ones, closest first."""
    _discover()
    try:
        return _registered[name]
    except KeyError:
        known = sorted(_registered)
        close = difflib.get_close_matches(name, known, n=len(known), cutoff=0.0)
        raise BackendRegistryError(
            f"unknown backend {name!r}; known backends: {', '.join(close) or '(none)'}") from None
