"""The locks in requirements/: one per Python scripts/lock names, each pinning pyproject.toml's dependencies."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import REPO
from tests.locks import LOCKS, SETS, LockError, lock_path, locked_pythons, read_lock

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
LOCKED = [(dependency_set, python) for python in locked_pythons() for dependency_set in SETS]


def requirements_of(dependency_set: str) -> list[Requirement]:
    """pyproject.toml's [project] dependencies, and for the cuda set its extra's too."""
    listed = PROJECT["dependencies"] + (PROJECT["optional-dependencies"]["cuda"] if dependency_set == "cuda" else [])
    return [Requirement(line) for line in listed]


def linux_x86_64(python: str) -> dict[str, str]:
    """The marker environment the locks are resolved for (scripts/lock's platform) on one Python."""
    return {
        "python_version": python,
        "python_full_version": f"{python}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }


def test_there_is_a_lock_for_each_set_and_python_and_no_other() -> None:
    """requirements/ holds exactly runtime and cuda locks for each Python scripts/lock names: none stale."""
    assert locked_pythons(), "scripts/lock names no Python"
    assert {path.name for path in LOCKS.iterdir()} == {
        lock_path(dependency_set, python).name for dependency_set, python in LOCKED
    }


@pytest.mark.parametrize(("dependency_set", "python"), LOCKED, ids=[f"{s}-py{p}" for s, p in LOCKED])
def test_the_lock_pins_every_dependency_within_its_specifier_with_hashes(dependency_set: str, python: str) -> None:
    """Each dependency of pyproject.toml is locked to a version its specifier allows, every pin with its hashes."""
    pins = read_lock(lock_path(dependency_set, python))  # raises on a pin without a hash or an exact version
    wrong = []
    for requirement in requirements_of(dependency_set):
        if requirement.marker and not requirement.marker.evaluate(linux_x86_64(python)):
            continue
        pin = pins.get(canonicalize_name(requirement.name))
        if pin is None:
            wrong.append(f"{requirement}: not in the lock")
        elif not requirement.specifier.contains(pin.version, prereleases=True):
            wrong.append(f"{requirement}: locked at {pin.version}")
    assert wrong == [], "run scripts/lock after changing pyproject.toml's dependencies"


@pytest.mark.parametrize("python", locked_pythons())
def test_the_cuda_set_is_the_plain_set_plus_nvidias_cuda_wheels(python: str) -> None:
    """The GPU image runs the CPU image's TensorFlow, numpy, protobuf...: the two locks differ only by nvidia-*."""
    plain = {name: pin.version for name, pin in read_lock(lock_path("runtime", python)).items()}
    cuda = {name: pin.version for name, pin in read_lock(lock_path("cuda", python)).items()}
    added = cuda.keys() - plain.keys()
    assert {name: cuda.get(name) for name in plain} == plain
    assert added, "the cuda lock adds nothing"
    assert all(name.startswith("nvidia-") for name in added), added


def test_a_pin_without_a_hash_or_an_exact_version_is_refused(tmp_path: Path) -> None:
    """The reader accepts scripts/lock's format and names the line of a pin that pip --require-hashes would refuse."""
    lock = tmp_path / "lock.txt"
    hash_a, hash_b = "a" * 64, "b" * 64
    lock.write_text(
        f"# header\nh11==0.16.0 \\\n    --hash=sha256:{hash_a} \\\n    --hash=sha256:{hash_b}\n    # via x\n"
    )
    (pin,) = read_lock(lock).values()
    assert (pin.name, str(pin.version), pin.hashes) == ("h11", "0.16.0", (hash_a, hash_b))
    for bad in ("h11==0.16.0\n", f"h11>=0.16 \\\n    --hash=sha256:{hash_a}\n"):
        lock.write_text(bad)
        with pytest.raises(LockError, match="h11"):
            read_lock(lock)
