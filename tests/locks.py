"""The hashed lock files in requirements/ that scripts/lock writes: their pins, read without pip."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

from tests.conftest import REPO

LOCKS = REPO / "requirements"
LOCK_SCRIPT = REPO / "scripts" / "lock"
SETS = ("runtime", "cuda")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Pin:
    """One locked package: its exact version and the sha256 of each of its files."""

    name: NormalizedName
    version: Version
    hashes: tuple[str, ...]


class LockError(Exception):
    def __init__(self, *, path: Path, line: str, reason: str) -> None:
        self.path, self.line, self.reason = path, line, reason
        super().__init__(f"{path}: {reason}: {line!r}")


def read_lock(path: Path) -> dict[NormalizedName, Pin]:
    """Every pin of a lock, by canonical name; a line that is not ``name==version --hash=sha256:...`` is an error."""
    text = path.read_text(encoding="utf-8")
    logical = re.sub(r"\\\n", " ", text)  # pip's continuation lines
    pins: dict[NormalizedName, Pin] = {}
    for line in logical.splitlines():
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        requirement, *options = re.split(r"\s+(?=--)", entry)
        parsed = Requirement(requirement)
        specifiers = list(parsed.specifier)
        if len(specifiers) != 1 or specifiers[0].operator != "==" or parsed.marker or parsed.url:
            raise LockError(path=path, line=line, reason="not one exact version (name==version)")
        hashes = tuple(option.removeprefix("--hash=sha256:") for option in options if option.startswith("--hash="))
        if not hashes or len(hashes) != len(options) or not all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes):
            raise LockError(path=path, line=line, reason="no sha256 hash, or an option other than --hash")
        name = canonicalize_name(parsed.name)
        pins[name] = Pin(name=name, version=Version(specifiers[0].version), hashes=hashes)
    return pins


def locked_pythons() -> tuple[str, ...]:
    """The Python versions scripts/lock writes locks for (its PYTHONS=(...) line)."""
    (listed,) = re.findall(r"^PYTHONS=\(([^)]*)\)$", LOCK_SCRIPT.read_text(encoding="utf-8"), re.MULTILINE)
    return tuple(listed.split())


def lock_path(dependency_set: str, python: str) -> Path:
    """requirements/SET-pyX.Y.txt, as scripts/lock names it and scripts/bootstrap.sh's lock_file reads it."""
    return LOCKS / f"{dependency_set}-py{python}.txt"


def dockerfile_lock(dockerfile: Path) -> Path:
    """The lock a Dockerfile installs with ``pip install --require-hashes -r``; exactly one is expected."""
    (named,) = re.findall(r"pip install [^\n]*--require-hashes -r (\S+)", dockerfile.read_text(encoding="utf-8"))
    return REPO / named
