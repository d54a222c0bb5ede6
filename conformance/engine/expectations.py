"""Expectations: what a backend is known not to do yet, in a plain TOML file.

Each backend ships one (``BackendSpec.expectations``); ``--expectations FILE`` replaces it.
Format::

    # expectations for backend "mock"
    [checks."rng.offset_exact"]
    status = "xfail"                      # or "skip"
    reason = "dropout falls back to the CPU generator"
    link = "https://github.com/org/repo/issues/12"    # optional
    torch = ">=2.13,<2.15"                # optional: applies only to these torch versions

    [checks."collectives.all_reduce_64mib@8"]   # only the run of the check on 8 ranks
    status = "skip"
    reason = "8 x 64 MiB exhausts the test machine's device memory"

``status = "xfail"``: the check runs; FAIL/ERROR/TIMEOUT/CRASH become XFAIL (the actual outcome
stays in the report), PASS becomes XPASS (a failure under ``--strict``: the expectation is
stale). ``status = "skip"``: the check does not run (SKIP with the reason); use it for checks
that would crash or hang. ``torch`` is a comma-separated list of ``>=``, ``>``, ``<=``, ``<``,
``==``, ``!=`` clauses on release numbers (``2.13`` compares as ``2.13.0``; local parts such as
``+cpu`` are ignored). Only the ``checks`` and ``upstream`` tables are allowed at the top
level, only the keys above in an entry. ``"id@N"`` limits an entry to the check's run on ``N``
ranks (one of the sizes it is written for) and wins over a plain ``"id"`` entry. An id no check
has is an error naming it and the closest known ids (catches typos);
a malformed file is an error naming the file and the line or key.

An ``[ops]`` table lists the operators a backend is known to compute wrongly, for the ``ops``
area (:mod:`accelkit.conformance.checks._opinfo`): OpInfo names (``name`` or
``name.variant``, as torch's ``op_db`` spells them) to an ``xfail`` status, a reason and
optionally the ``dtypes`` it applies to (default: every dtype), a ``link`` and a ``torch``
range. A matching row that differs from the CPU is XFAIL, one that matches is XPASS (remove
the entry); the check fails on any other row that differs::

    [ops."linalg.eigh"]
    status = "xfail"
    reason = "the device's eigensolver orders degenerate eigenvectors differently"
    dtypes = ["complex64"]

The same file may hold an ``[upstream]`` table for ``accelkit upstream`` (PyTorch's own tests):
test node-id glob patterns (``fnmatch``: ``*``, ``?``, ``[...]``; node ids are
``<path relative to --tests>::<Class>::<test>``) to a status, a reason, a ``category`` (one of
:data:`CATEGORIES`), an optional ``link`` and ``torch`` range::

    [upstream."test/distributed/tensor/test_random_ops.py::*::test_deterministic_uniform_2d"]
    status = "xfail"
    reason = "uniform_ on a 2-D mesh draws a different offset"
    category = "backend-bug"
    link = "https://github.com/org/repo/issues/34"

:func:`load` ignores that table; :func:`load_upstream` reads it.
"""

from __future__ import annotations

import difflib
import fnmatch
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from accelkit.core.versions import version_matches

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

STATUSES = ("xfail", "skip")
#: Why an upstream test is expected not to pass (``category`` of an ``[upstream]`` entry).
CATEGORIES = ("unsupported-op", "version-skew", "torch-limitation", "backend-bug")
_KEYS = {"status", "reason", "link", "torch"}
_UPSTREAM_KEYS = _KEYS | {"category"}
_OPS_KEYS = _KEYS | {"dtypes"}
_TABLES = ("checks", "upstream", "ops")


class ExpectationsError(Exception):
    """The expectations file is malformed or names an unknown check."""


@dataclass(frozen=True)
class Expectation:
    check_id: str
    status: str
    reason: str
    link: str | None = None
    torch: str | None = None
    #: The world size an ``"id@N"`` entry is limited to; None for every size.
    world_size: int | None = None

    @property
    def key(self) -> str:
        """The entry's key in the file: ``id`` or ``id@N``."""
        return self.check_id if self.world_size is None else f"{self.check_id}@{self.world_size}"

    def to_dict(self) -> dict:
        return {"key": self.key, "status": self.status, "reason": self.reason,
                "link": self.link, "torch": self.torch}


def lookup(expectations: Mapping[str, Expectation], check_id: str,
           world_size: int) -> Expectation | None:
    """The expectation for ``check_id`` run on ``world_size`` ranks: ``id@N`` wins over ``id``."""
    return expectations.get(f"{check_id}@{world_size}") or expectations.get(check_id)


@dataclass(frozen=True)
class UpstreamExpectation:
    """One ``[upstream."PATTERN"]`` entry: tests whose node id matches ``pattern``."""

    pattern: str
    status: str
    reason: str
    category: str
    link: str | None = None
    torch: str | None = None

    def matches(self, node_id: str) -> bool:
        """Whether ``node_id`` matches the pattern as a whole, or by the file's name and the
        test id: a pattern written with checkout paths
        (``test/distributed/tensor/test_random_ops.py::*``) matches the same file run from a
        plain folder of test files (``test_random_ops.py::...`` or ``tensor/test_random_ops.py::...``)."""
        if fnmatch.fnmatchcase(node_id, self.pattern):
            return True
        path, sep, test = node_id.partition("::")
        _, pattern_sep, test_pattern = self.pattern.partition("::")
        return bool(sep and pattern_sep) and self._file_matches(path) \
            and fnmatch.fnmatchcase(test, test_pattern)

    def applies_to_file(self, path: str) -> bool:
        """Whether the pattern can match tests of the file at ``path`` (relative to
        ``--tests``): by the whole path or by the file's name."""
        return self._file_matches(path)

    def _file_matches(self, path: str) -> bool:
        file_pattern = self.pattern.partition("::")[0]
        return fnmatch.fnmatchcase(path, file_pattern) or fnmatch.fnmatchcase(
            PurePosixPath(path).name, PurePosixPath(file_pattern).name)

    def to_dict(self) -> dict:
        return {"pattern": self.pattern, "status": self.status, "reason": self.reason,
                "category": self.category, "link": self.link, "torch": self.torch}


def _line_of(text: str, check_id: str, table: str = "checks") -> int | None:
    pattern = re.compile(r'^\s*\[\s*' + table + r'\s*\.\s*["\']?' + re.escape(check_id)
                         + r'["\']?\s*\]')
    for number, line in enumerate(text.splitlines(), 1):
        if pattern.match(line):
            return number
    return None


def _split_key(key: str) -> tuple[str, int | None] | None:
    """``"id"`` -> (id, None), ``"id@N"`` -> (id, N); None when N is not a positive integer."""
    check_id, at, size = key.partition("@")
    if not at:
        return check_id, None
    return (check_id, int(size)) if size.isdigit() and int(size) > 0 else None


def _read(path: Path) -> tuple[str, dict]:
    """The file's text and parsed TOML; only the known top-level tables are allowed."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ExpectationsError(f"cannot read expectations file {path}: {exc.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ExpectationsError(f"{path}: not valid TOML: {exc}") from None
    extra = sorted(set(data) - set(_TABLES))
    if extra:
        raise ExpectationsError(
            f"{path}: unknown top-level key(s) {', '.join(map(repr, extra))}; "
            "entries go under [checks.\"area.name\"], [upstream.\"PATTERN\"] or [ops.\"OP\"]")
    return text, data


def _entry(where: str, key: str, entry: dict, allowed: set[str],
           torch_version: str) -> bool:
    """Validate the keys every entry shares; False when its ``torch`` range excludes
    ``torch_version``."""
    unknown = sorted(set(entry) - allowed)
    if unknown:
        raise ExpectationsError(
            f"{where}: {key} has unknown key(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(allowed))}")
    status = entry.get("status")
    if status not in STATUSES:
        raise ExpectationsError(
            f"{where}: {key}.status is {status!r}; expected one of {', '.join(STATUSES)}")
    reason = entry.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise ExpectationsError(f"{where}: {key}.reason is missing; say why")
    for opt in ("link", "torch"):
        if opt in entry and not isinstance(entry[opt], str):
            raise ExpectationsError(f"{where}: {key}.{opt} must be a string")
    torch_range = entry.get("torch")
    if torch_range is None:
        return True
    try:
        return version_matches(torch_version, torch_range)
    except ValueError as exc:
        raise ExpectationsError(f"{where}: {key}.torch: {exc}") from None


def load(path: str | Path, known: Mapping[str, Any] | set[str],
         torch_version: str) -> dict[str, Expectation]:
    """Parse ``path``; return the expectations that apply to ``torch_version``, by key (``id``
    or ``id@N``). ``known`` holds the check ids (a mapping to check definitions also checks
    that an ``id@N`` entry names one of the check's world sizes)."""
    path = Path(path)
    text, data = _read(path)
    entries = data.get("checks", {})
    if not isinstance(entries, dict):
        raise ExpectationsError(f"{path}: 'checks' must be a table of [checks.\"area.name\"] entries")
    result: dict[str, Expectation] = {}
    for check_id, entry in entries.items():
        line = _line_of(text, check_id)
        where = f"{path}:{line}" if line else str(path)
        if not isinstance(entry, dict):
            # e.g. [checks.rng] with a nested key: ids with dots must be quoted
            raise ExpectationsError(
                f"{where}: checks.{check_id} is not an entry; quote dotted ids: "
                f"[checks.\"area.name\"]")
        if all(isinstance(v, dict) for v in entry.values()) and entry:
            nested = next(iter(entry))
            raise ExpectationsError(
                f"{where}: [checks.{check_id}.{nested}] looks like an unquoted id; write "
                f"[checks.\"{check_id}.{nested}\"]")
        key = f"checks.\"{check_id}\""
        split = _split_key(check_id)
        if split is None:
            raise ExpectationsError(
                f"{where}: {key}: after '@' comes the world size the entry applies to, a "
                "positive integer (e.g. \"collectives.all_reduce_sum@8\")")
        base_id, world_size = split
        if base_id not in known:
            close = difflib.get_close_matches(base_id, sorted(known), n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ExpectationsError(f"{where}: unknown check id {base_id!r}{hint}")
        sizes = getattr(known[base_id], "world_sizes", None) if isinstance(known, Mapping) else None
        if world_size is not None and sizes is not None and world_size not in sizes:
            raise ExpectationsError(
                f"{where}: {key}: {base_id} is written for world sizes "
                f"{', '.join(map(str, sizes))}, not {world_size}")
        if not _entry(where, key, entry, _KEYS, torch_version):
            continue
        result[check_id] = Expectation(base_id, entry["status"], entry["reason"].strip(),
                                       entry.get("link"), entry.get("torch"), world_size)
    return result


@dataclass(frozen=True)
class OpExpectation:
    """One ``[ops."OP"]`` entry: the op (an OpInfo name) is known to differ from the CPU, in
    ``dtypes`` (None: every dtype)."""

    op: str
    reason: str
    dtypes: tuple[str, ...] | None = None
    link: str | None = None
    torch: str | None = None

    def covers(self, row: dict) -> bool:
        """Whether a row of the ``ops`` area (``op``, ``dtype``) is this entry's."""
        return row.get("op") == self.op and (self.dtypes is None or row.get("dtype") in self.dtypes)


def load_ops(path: str | Path, known: set[str] | Callable[[], set[str]] | None,
             torch_version: str) -> dict[str, OpExpectation]:
    """The ``[ops]`` entries of ``path`` that apply to ``torch_version``, by op name. ``known``
    holds the OpInfo names (an unknown name is an error naming the closest), or gives them when
    called (only for a file with ``[ops]`` entries: torch's op_db takes seconds to import);
    None skips that check."""
    path = Path(path)
    text, data = _read(path)
    entries = data.get("ops", {})
    if not isinstance(entries, dict):
        raise ExpectationsError(f"{path}: 'ops' must be a table of [ops.\"OP\"] entries")
    if callable(known) and entries:
        known = known()
    elif callable(known):
        known = None
    result = {}
    for op, entry in entries.items():
        line = _line_of(text, op, "ops")
        where = f"{path}:{line}" if line else str(path)
        key = f"ops.\"{op}\""
        if not isinstance(entry, dict) or (entry and all(isinstance(v, dict) for v in entry.values())):
            raise ExpectationsError(f"{where}: ops.{op} is not an entry; quote dotted names: "
                                    f"[ops.\"name.variant\"]")
        if known is not None and op not in known:
            close = difflib.get_close_matches(op, sorted(known), n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ExpectationsError(f"{where}: {key}: torch's op_db has no OpInfo {op!r}{hint}")
        if not _entry(where, key, entry, _OPS_KEYS, torch_version):
            continue
        if entry["status"] != "xfail":
            raise ExpectationsError(f"{where}: {key}.status must be \"xfail\" (an op's rows "
                                    "always run; skip the whole check under [checks] instead)")
        dtypes = entry.get("dtypes")
        if dtypes is not None and (not isinstance(dtypes, list)
                                   or not all(isinstance(d, str) for d in dtypes)):
            raise ExpectationsError(f"{where}: {key}.dtypes must be a list of dtype names "
                                    "(e.g. [\"float16\", \"bfloat16\"])")
        result[op] = OpExpectation(op, entry["reason"].strip(),
                                   tuple(dtypes) if dtypes is not None else None,
                                   entry.get("link"), entry.get("torch"))
    return result


def load_upstream(path: str | Path, torch_version: str) -> list[UpstreamExpectation]:
    """The ``[upstream]`` entries of ``path`` that apply to ``torch_version``, in file order
    (a test matched by several patterns takes the first)."""
    path = Path(path)
    text, data = _read(path)
    entries = data.get("upstream", {})
    if not isinstance(entries, dict):
        raise ExpectationsError(
            f"{path}: 'upstream' must be a table of [upstream.\"PATTERN\"] entries")
    result = []
    for pattern, entry in entries.items():
        line = _line_of(text, pattern, "upstream")
        where = f"{path}:{line}" if line else str(path)
        key = f"upstream.\"{pattern}\""
        if not isinstance(entry, dict) or (entry and all(isinstance(v, dict)
                                                         for v in entry.values())):
            raise ExpectationsError(
                f"{where}: {key} is not an entry; quote the pattern: "
                "[upstream.\"test/distributed/x.py::Class::test_*\"]")
        if not _entry(where, key, entry, _UPSTREAM_KEYS, torch_version):
            continue
        category = entry.get("category")
        if category not in CATEGORIES:
            raise ExpectationsError(
                f"{where}: {key}.category is {category!r}; expected one of "
                f"{', '.join(CATEGORIES)}")
        result.append(UpstreamExpectation(pattern, entry["status"], entry["reason"].strip(),
                                          category, entry.get("link"), entry.get("torch")))
    return result
