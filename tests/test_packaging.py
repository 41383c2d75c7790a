"""The release artefacts: a wheel and an sdist built from the checkout, the wheel installed into a fresh
virtual environment and run from outside the checkout, as a user who never cloned it would."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

from crossover_monitor import __version__
from tests.conftest import REPO

pytestmark = pytest.mark.slow


def _run(*command: str | Path, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(c) for c in command], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
    return done


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel and sdist, built without network (this environment's setuptools, no build isolation)."""
    out = tmp_path_factory.mktemp("dist")
    source = tmp_path_factory.mktemp("source")
    # Built from a copy of the tracked files, so that nothing this checkout has lying around gets in.
    files = _run("git", "ls-files", "-z", cwd=REPO).stdout.split("\0")
    # A tracked file can be missing from the work tree while tests run (coverage's data file, rewritten).
    for name in (n for n in files if n and (REPO / n).is_file()):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes((REPO / name).read_bytes())
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", out, source, cwd=source)
    script = "from setuptools import build_meta as b; import sys; b.build_sdist(sys.argv[1])"
    _run(sys.executable, "-c", script, out, cwd=source)
    return out


def test_the_wheel_holds_the_package_and_its_entry_point(built: Path) -> None:
    """Every module of crossover_monitor/ is in the wheel, tests and benchmarks are not, and the command is declared."""
    (wheel,) = built.glob(f"crossover_monitor-{__version__}-py3-none-any.whl")
    names = zipfile.ZipFile(wheel).namelist()
    expected = {str(p.relative_to(REPO)) for p in (REPO / "crossover_monitor").rglob("*.py")}
    assert expected <= set(names)
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/"))]
    # One top-level package, named after the project: nothing as generic as "monitor" or "tests".
    top_level = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert top_level == {"crossover_monitor"}
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert "crossover-monitor = crossover_monitor.cli.main:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
    (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    assert "License-Expression: Apache-2.0" in text or "License: Apache-2.0" in text
    assert "Requires-Dist: tensorflow" in text


def test_the_sdist_carries_the_license_and_readme(built: Path) -> None:
    """The sdist holds the licence, the README, pyproject.toml and the package's sources."""
    (sdist,) = built.glob(f"crossover_monitor-{__version__}.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
    assert {"LICENSE", "README.md", "pyproject.toml", "crossover_monitor/cli/main.py"} <= names


def test_the_installed_wheel_runs_from_outside_the_checkout(built: Path, tmp_path: Path) -> None:
    """A fresh venv with only the wheel of this project: `--version`, `check-config` and a short `once` work.

    Its dependencies (TensorFlow and the rest) come from the test environment's site-packages through a
    path file, which adds them without running that directory's own path files: this checkout's
    editable install is not seen, and ``crossover_monitor`` can only come from the wheel.
    """
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    site = Path(
        _run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=tmp_path).stdout.strip()
    )
    (site / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    (wheel,) = built.glob("*.whl")
    _run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", wheel, cwd=tmp_path)
    where = _run(
        python, "-c", "import crossover_monitor; print(crossover_monitor.__file__)", cwd=tmp_path
    ).stdout.strip()
    assert Path(where).is_relative_to(venv), where
    command = venv / "bin" / "crossover-monitor"
    assert _run(command, "--version", cwd=tmp_path).stdout.strip().endswith(__version__)
    config = tmp_path / "config.yaml"
    # The guard off: a busy CI machine would withhold the CPU.
    config.write_text(
        "benchmark: {sizes: [8, 32], modes: [compute], timing: {size_budget: 200ms}}\nguard: {enabled: false}\n"
    )
    assert "configuration is valid" in _run(command, "check-config", "--config", config, cwd=tmp_path).stdout
    outcome = json.loads(_run(command, "once", "--json", "--config", config, cwd=tmp_path, timeout=300).stdout)
    assert outcome["result"] == "success"
    sizes = {m["key"]["size"] for m in outcome["snapshot"]["measurements"] if m["key"]["device"] == "/CPU:0"}
    assert {8, 32} <= sizes


def test_the_release_command_builds_the_versioned_wheel_and_sdist_and_checks_them(tmp_path: Path) -> None:
    """`scripts/release --out DIR` builds HEAD's wheel and sdist named after the version; `twine check --strict`
    passes them (the command fails otherwise). Images are left to --images, which needs a registry."""
    done = subprocess.run(
        [REPO / "scripts" / "release", "--out", tmp_path], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"crossover_monitor-{__version__}-py3-none-any.whl",
        f"crossover_monitor-{__version__}.tar.gz",
    ]
    assert done.stdout.count("PASSED") == 2, done.stdout
    refused = subprocess.run([REPO / "scripts" / "release", "--push"], capture_output=True, text=True, check=False)
    assert (refused.returncode, refused.stderr.strip()) == (2, "scripts/release: --push needs --images REGISTRY")
