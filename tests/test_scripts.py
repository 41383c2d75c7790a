"""scripts/bootstrap.sh as scripts/run uses it: GPU detection on a fake root, the extra it picks, install stamps."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from tests.conftest import REPO
from tests.locks import lock_path, read_lock

BOOTSTRAP = REPO / "scripts" / "bootstrap.sh"


def bash(script: str, *, cwd: Path = REPO, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``script`` run by bash with scripts/bootstrap.sh sourced, as scripts/run runs it (errexit, nounset, pipefail)."""
    return subprocess.run(
        ["bash", "-c", f"set -euo pipefail; . {BOOTSTRAP}; {script}"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def _no_smi(tmp_path: Path) -> str:
    """An nvidia-smi that is not installed."""
    return str(tmp_path / "no-nvidia-smi")


def _pci_function(root: Path, name: str, vendor: str, kind: str) -> None:
    function = root / "sys" / "bus" / "pci" / "devices" / name
    function.mkdir(parents=True)
    (function / "vendor").write_text(vendor + "\n")
    (function / "class").write_text(kind + "\n")


def test_an_empty_root_shows_no_gpu(tmp_path: Path) -> None:
    """No driver list, device node, nvidia-smi or NVIDIA controller: no GPU, and nothing printed."""
    done = bash(f"nvidia_gpu_seen {tmp_path} {_no_smi(tmp_path)}")
    assert done.returncode == 1
    assert done.stdout == ""


def test_the_drivers_gpu_list_shows_a_gpu(tmp_path: Path) -> None:
    """A GPU in /proc/driver/nvidia/gpus is found first, and named by its path."""
    gpu = tmp_path / "proc" / "driver" / "nvidia" / "gpus" / "0000:17:00.0"
    gpu.mkdir(parents=True)
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia0").touch()
    done = bash(f"nvidia_gpu_seen {tmp_path} {_no_smi(tmp_path)}")
    assert done.returncode == 0
    assert done.stdout.strip() == str(gpu)


def test_a_device_node_shows_a_gpu(tmp_path: Path) -> None:
    """/dev/nvidia0 alone (the driver's /proc entry hidden, as in some containers) is a GPU."""
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia0").touch()
    done = bash(f"nvidia_gpu_seen {tmp_path} {_no_smi(tmp_path)}")
    assert done.returncode == 0
    assert done.stdout.strip() == f"{tmp_path}/dev/nvidia0"


def test_a_working_nvidia_smi_shows_a_gpu_and_a_failing_one_does_not(tmp_path: Path) -> None:
    """nvidia-smi -L listing a GPU counts (its first line is quoted); one that fails or lists nothing does not."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\n[ "$1" = -L ] && printf "GPU 0: NVIDIA H200 (UUID: GPU-1)\\nGPU 1: NVIDIA H200\\n"\n')
    smi.chmod(0o755)
    done = bash(f"nvidia_gpu_seen {tmp_path} {smi}")
    assert done.returncode == 0
    assert done.stdout.strip() == "nvidia-smi -L: GPU 0: NVIDIA H200 (UUID: GPU-1)"
    smi.write_text(
        "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the driver' >&2\nexit 9\n"
    )
    assert bash(f"nvidia_gpu_seen {tmp_path} {smi}").returncode == 1
    smi.write_text("#!/bin/sh\nexit 0\n")
    assert bash(f"nvidia_gpu_seen {tmp_path} {smi}").returncode == 1


def test_an_nvidia_display_controller_without_its_driver_shows_a_gpu(tmp_path: Path) -> None:
    """An NVIDIA 3D controller on the PCI bus is a GPU without its driver; Intel graphics or NVIDIA audio is not."""
    _pci_function(tmp_path, "0000:00:02.0", "0x8086", "0x030000")
    _pci_function(tmp_path, "0000:17:00.1", "0x10de", "0x040300")
    assert bash(f"nvidia_gpu_seen {tmp_path} {_no_smi(tmp_path)}").returncode == 1
    _pci_function(tmp_path, "0000:17:00.0", "0x10de", "0x030200")
    done = bash(f"nvidia_gpu_seen {tmp_path} {_no_smi(tmp_path)}")
    assert done.returncode == 0
    assert done.stdout.strip() == "an NVIDIA display controller at PCI 0000:17:00.0, its driver not loaded"


def _environment(**changes: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CROSSOVER_MONITOR_EXTRA"}
    return {**env, **changes}


def test_run_picks_the_cuda_extra_where_a_gpu_shows_and_says_so_in_one_line(tmp_path: Path) -> None:
    """With a GPU, run_extra prints 'cuda' and one stderr line naming what it found and the extra."""
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia0").touch()
    done = bash(f"run_extra {tmp_path} {_no_smi(tmp_path)}", env=_environment())
    assert done.returncode == 0
    assert done.stdout == "cuda\n"
    assert done.stderr == (
        f"scripts/run: NVIDIA GPU found ({tmp_path}/dev/nvidia0): the package with the cuda extra, TensorFlow's CUDA "
        "libraries (several GB the first time; CROSSOVER_MONITOR_EXTRA= to go without)\n"
    )


def test_run_keeps_the_plain_install_where_no_gpu_shows(tmp_path: Path) -> None:
    """Without a GPU, run_extra picks no extra (the path as before) and says what it looked for."""
    done = bash(f"run_extra {tmp_path} {_no_smi(tmp_path)}", env=_environment())
    assert done.returncode == 0
    assert done.stdout == "\n"
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith("scripts/run: no NVIDIA GPU found (no /proc/driver/nvidia/gpus/*, /dev/nvidia0")
    assert "without the cuda extra" in done.stderr


@pytest.mark.parametrize("chosen", ["", "cuda,plot"])
def test_an_extra_chosen_in_the_environment_wins_over_detection(tmp_path: Path, chosen: str) -> None:
    """CROSSOVER_MONITOR_EXTRA, even empty, is taken as it is, GPU or not, and the line says so."""
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia0").touch()
    done = bash(f"run_extra {tmp_path} {_no_smi(tmp_path)}", env=_environment(CROSSOVER_MONITOR_EXTRA=chosen))
    assert done.stdout == chosen + "\n"
    assert done.stderr.startswith(f"scripts/run: CROSSOVER_MONITOR_EXTRA='{chosen}' chosen, no GPU detection: ")
    assert done.stderr.rstrip().endswith("with [cuda,plot]" if chosen else "without extras")


def fake_venv(tmp_path: Path, version: str = "3.11") -> Path:
    """A checkout's pyproject.toml and locks, and a venv whose interpreter records what pip was asked to do."""
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    shutil.copytree(REPO / "requirements", tmp_path / "requirements")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    calls = tmp_path / "pip-calls"
    # Stands in for the venv's interpreter: answers the version query, records every pip call.
    python.write_text(f'#!/bin/sh\nif [ "$1" = -c ]; then echo {version}; else echo "$*" >> {calls}; fi\n')
    python.chmod(0o755)
    return calls


def installs(tmp_path: Path, calls: Path, extra: str, *requirements: str) -> list[str]:
    """The pip calls bootstrap_venv makes for ``extra``, beside upgrading pip itself."""
    before = calls.read_text().splitlines() if calls.exists() else []
    done = bash(f"bootstrap_venv '{extra}' {' '.join(requirements)}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    after = calls.read_text().splitlines()
    return [line for line in after[len(before) :] if "--upgrade pip" not in line]


def locked(dependency_set: str) -> str:
    return f"-m pip install -q --require-hashes -r requirements/{dependency_set}-py3.11.txt"


def test_a_venv_made_without_the_cuda_extra_gets_it_once_a_gpu_appears(tmp_path: Path) -> None:
    """Each extra has its own stamp: cuda is installed after a plain install, each once, again on a new pyproject."""
    calls = fake_venv(tmp_path)
    project = "-m pip install -q --no-deps -e ."
    assert installs(tmp_path, calls, "") == [locked("runtime"), project]
    assert installs(tmp_path, calls, "") == []  # a restart needs no package index
    assert installs(tmp_path, calls, "cuda") == [locked("cuda"), project]  # the GPU appeared
    assert installs(tmp_path, calls, "cuda") == []
    os.utime(tmp_path / "pyproject.toml", (1e10, 1e10))  # a changed pyproject.toml, newer than every stamp
    assert installs(tmp_path, calls, "cuda") == [locked("cuda"), project]


def test_a_refreshed_lock_is_installed_again(tmp_path: Path) -> None:
    """scripts/lock rewrote the lock: the next start installs it, once."""
    calls = fake_venv(tmp_path)
    assert installs(tmp_path, calls, "")
    os.utime(tmp_path / ".venv" / ".installed", (1, 1))  # the lock, as it is, is newer than the install
    assert installs(tmp_path, calls, "") == [locked("runtime"), "-m pip install -q --no-deps -e ."]
    assert installs(tmp_path, calls, "") == []


def test_extras_no_lock_covers_are_resolved_held_to_the_locked_versions(tmp_path: Path) -> None:
    """cuda,plot: the cuda lock with hashes, then plot resolved with the lock's pins (no hashes) as constraints."""
    calls = fake_venv(tmp_path)
    assert installs(tmp_path, calls, "cuda,plot", "torch==2.13.0") == [
        locked("cuda"),
        "-m pip install -q -e .[plot] torch==2.13.0 -c .venv/lock-constraints.txt",
    ]
    constraints = (tmp_path / ".venv" / "lock-constraints.txt").read_text().splitlines()
    pins = [line for line in constraints if line and not line.lstrip().startswith("#")]
    assert "tensorflow==" + str(read_lock(lock_path("cuda", "3.11"))[canonicalize_name("tensorflow")].version) in pins
    assert all(re.fullmatch(r"[a-z0-9.-]+==\S+", line) for line in pins), pins


def test_a_python_without_a_lock_stops_the_set_up_naming_the_locks_there_are(tmp_path: Path) -> None:
    """No lock for the venv's Python: nothing is installed, and the message says which Pythons have one."""
    calls = fake_venv(tmp_path, version="3.99")
    done = bash("bootstrap_venv ''", cwd=tmp_path)
    assert done.returncode != 0
    assert "no lock of the runtime dependencies for Python 3.99 (requirements/runtime-py3.99.txt)" in done.stderr
    assert "runtime-py3.11.txt" in done.stderr
    assert "PYTHON=python3.11" in done.stderr
    assert not calls.exists()


def fake_systemd(tmp_path: Path, *enabled: str) -> dict[str, str]:
    """systemctl and sudo on PATH: a list of enabled unit files in a file, and a log of disable and stop calls."""
    bin_dir, state = tmp_path / "bin", tmp_path / "enabled"
    bin_dir.mkdir()
    state.write_text("".join(f"{unit}\n" for unit in enabled))
    (bin_dir / "systemctl").write_text(
        "#!/bin/sh\n"
        f'case "$1" in\n'
        f'  list-unit-files) sed "s/$/ enabled enabled/" {state} ;;\n'
        f'  disable) echo "$*" >> {tmp_path}/calls; grep -vx "$3" {state} > {state}.new; mv {state}.new {state} ;;\n'
        f'  *) echo "$*" >> {tmp_path}/calls ;;\n'
        "esac\n"
    )
    (bin_dir / "sudo").write_text('#!/bin/sh\nexec "$@"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return _environment(PATH=f"{bin_dir}:{os.environ['PATH']}")


def install_enabling(tmp_path: Path, env: dict[str, str], *units: str, root: Path) -> subprocess.CompletedProcess[str]:
    """Takes the enabled units, "installs" packages that enable ``units``, then undoes what they enabled."""
    added = "".join(f"{unit}\\n" for unit in units)
    return bash(
        f"before=$(enabled_units); printf '{added}' >> {tmp_path}/enabled; "
        f'disable_units_enabled_since "$before" scripts/test {root}',
        env=env,
    )


def test_services_the_package_install_enabled_are_stopped_disabled_and_named(tmp_path: Path) -> None:
    """Debian's prometheus enables a system Prometheus on :9090: scripts/test stops and disables it, and says so."""
    env = fake_systemd(tmp_path, "e2scrub_reap.service", "ssh.service")
    (tmp_path / "run" / "systemd" / "system").mkdir(parents=True)  # systemd runs
    done = install_enabling(tmp_path, env, "prometheus.service", "podman.socket", root=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "calls").read_text().splitlines() == [
        "disable --quiet podman.socket",
        "stop podman.socket",
        "disable --quiet prometheus.service",
        "stop prometheus.service",
    ]
    assert (tmp_path / "enabled").read_text().split() == ["e2scrub_reap.service", "ssh.service"]
    assert done.stderr == (
        "scripts/test: stopped and disabled what installing its packages enabled, which the tests do not use: "
        "podman.socket prometheus.service (systemctl enable --now UNIT brings one back)\n"
    )


def test_a_service_enabled_before_the_install_is_left_alone(tmp_path: Path) -> None:
    """An operator's own Prometheus, enabled before, stays enabled and running; nothing is said."""
    env = fake_systemd(tmp_path, "prometheus.service")
    (tmp_path / "run" / "systemd" / "system").mkdir(parents=True)
    done = install_enabling(tmp_path, env, root=tmp_path)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "calls").exists()
    assert done.stderr == ""


def test_without_a_running_systemd_the_new_services_are_disabled_not_stopped(tmp_path: Path) -> None:
    """In a container or chroot nothing was started: the units are disabled so that a boot does not start them."""
    env = fake_systemd(tmp_path)
    done = install_enabling(tmp_path, env, "prometheus-alertmanager.service", root=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "calls").read_text().splitlines() == ["disable --quiet prometheus-alertmanager.service"]
