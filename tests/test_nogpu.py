"""Why a backend found no GPU: the decision from facts to a sentence, the host readers, and this machine's real case."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from crossover_monitor.measure.nogpu import (
    Facts,
    HostGpu,
    cuda_libraries,
    explain,
    hides_every_gpu,
    missing_libraries,
    nvidia_wheel_dirs,
    read_host,
)
from tests.conftest import REPO

DRIVER = HostGpu(driver=True, driver_gpus=2, on_pci=True)
BUILD_FIX = "install the cuda extra"
LIBRARIES_FIX = "install tensorflow[and-cuda]"


def facts(host: HostGpu = DRIVER, **changes: Any) -> Facts:
    """A CUDA build of TensorFlow on a host with the driver and two GPUs, with ``changes`` applied."""
    base = Facts(framework="TensorFlow", host=host, cuda_build=True, build_fix=BUILD_FIX, libraries_fix=LIBRARIES_FIX)
    return dataclasses.replace(base, **changes)


def test_no_driver_on_a_cpu_only_host_is_said_to_be_fine() -> None:
    """No driver and no NVIDIA GPU on the bus: a CPU-only machine is said to be fine, and how a GPU one is fixed."""
    said = explain(facts(HostGpu(driver=False), cuda_build=False, missing_libraries=("libcudnn.so.9",)))
    assert said.startswith("no NVIDIA GPU or driver on this host (no /proc/driver/nvidia; libcuda.so.1 does not load)")
    assert "fine on a CPU-only machine" in said
    assert "install NVIDIA's driver" in said
    assert "--gpus all" in said
    assert "libcudnn" not in said  # the build and libraries do not matter before there is a driver
    assert "CPU-only, although" not in said


def test_an_nvidia_gpu_on_the_bus_without_its_driver_asks_for_the_driver() -> None:
    """An NVIDIA display controller on the PCI bus but no driver: install the driver, not 'fine on a CPU-only box'."""
    said = explain(facts(HostGpu(driver=False, on_pci=True)))
    assert said.startswith("an NVIDIA GPU is on the PCI bus but no NVIDIA driver is loaded")
    assert "install NVIDIA's driver" in said
    assert "fine on a CPU-only machine" not in said


@pytest.mark.parametrize(
    ("value", "gpus", "hidden"),
    [
        (None, 2, False),
        ("", 2, True),
        (" ", None, True),
        ("-1", 2, True),
        ("-1,0", 2, True),  # CUDA stops at the first entry that names no GPU
        ("0,-1", 2, False),
        ("1", 2, False),
        ("2", 2, True),  # only 0 and 1 exist
        ("7", None, False),  # the driver's count unknown: an index is taken as valid
        ("GPU-8c5e2b37-aaaa-bbbb-cccc-000000000000", 2, False),
        ("MIG-0a1b2c3d-aaaa-bbbb-cccc-000000000000", 2, False),
        ("none", 2, True),
    ],
)
def test_visible_devices_that_name_no_gpu_hide_every_gpu(value: str | None, gpus: int | None, *, hidden: bool) -> None:
    """CUDA_VISIBLE_DEVICES hides every GPU when its first entry is empty, negative, out of range or no GPU name."""
    assert hides_every_gpu(value, gpus) is hidden


def test_visible_devices_hiding_every_gpu_says_to_unset_it() -> None:
    """With the driver there but CUDA_VISIBLE_DEVICES=-1, the sentence names the variable, its value and the fix."""
    said = explain(facts(HostGpu(driver=True, driver_gpus=2, visible_devices="-1"), cuda_build=False))
    assert said == (
        "CUDA_VISIBLE_DEVICES='-1' hides every GPU from this process, the driver lists 2: unset it, "
        "or set it to the GPUs to time (e.g. CUDA_VISIBLE_DEVICES=0)"
    )
    unknown = explain(facts(HostGpu(driver=True, visible_devices="")))
    assert unknown.startswith("CUDA_VISIBLE_DEVICES='' hides every GPU from this process: unset it")


def test_a_cpu_only_build_with_the_driver_present_names_the_build_fix() -> None:
    """A CPU-only install of the framework on a host with the driver: its own fix, nothing about libraries."""
    said = explain(facts(cuda_build=False, missing_libraries=("libcublas.so.12",), framework_says="ignored"))
    assert said == f"TensorFlow as installed here is CPU-only, although the NVIDIA driver is loaded: {BUILD_FIX}"
    visible = explain(facts(HostGpu(driver=True, driver_gpus=2, visible_devices="0"), cuda_build=False))
    assert visible.startswith("TensorFlow as installed here is CPU-only")  # a GPU that is visible hides nothing


def test_libraries_that_do_not_load_are_named_with_their_fix() -> None:
    """A CUDA build with the driver but CUDA libraries that do not load: which ones, and how to get them."""
    said = explain(facts(missing_libraries=("libcufft.so.11", "libcudnn.so.9")))
    assert said == (
        "TensorFlow is a CUDA build and the NVIDIA driver is loaded, but CUDA libraries it needs do not load "
        f"(libcufft.so.11, libcudnn.so.9): {LIBRARIES_FIX}"
    )
    quoted = explain(facts(missing_libraries=("libcudnn.so.9",), framework_says="cuDNN not found"))
    assert "(libcudnn.so.9) (TensorFlow says: cuDNN not found): " in quoted


def test_a_missing_uvm_node_says_how_to_create_it() -> None:
    """The driver's /proc entry without /dev/nvidia-uvm (a sandbox started before the node existed): nvidia-modprobe."""
    said = explain(facts(HostGpu(driver=True, driver_gpus=1, uvm_missing=True), framework_says="cuInit failed"))
    assert said.startswith(
        "the NVIDIA driver is loaded but /dev/nvidia-uvm, which CUDA needs, is missing "
        "(TensorFlow says: cuInit failed): create it with `sudo nvidia-modprobe -u -c=0`"
    )
    missing = explain(facts(HostGpu(driver=True, uvm_missing=True), missing_libraries=("libcudnn.so.9",)))
    assert missing.startswith("TensorFlow is a CUDA build and the NVIDIA driver is loaded, but CUDA libraries")


def test_a_cuda_build_that_finds_nothing_else_wrong_quotes_the_framework() -> None:
    """Driver, build and libraries all fine yet no GPU: the framework's own words and where to look next."""
    said = explain(facts(framework="PyTorch", framework_says="The NVIDIA driver on your system is too old"))
    assert said.startswith(
        "PyTorch is a CUDA build, the NVIDIA driver is loaded and the CUDA libraries load, yet it found no GPU "
        "(PyTorch says: The NVIDIA driver on your system is too old): check that nvidia-smi lists the GPU"
    )
    assert "--log-level debug once" in said
    assert "says" not in explain(facts())


def _pci_function(root: Path, name: str, vendor: str, kind: str) -> None:
    function = root / name
    function.mkdir(parents=True)
    (function / "vendor").write_text(vendor + "\n")
    (function / "class").write_text(kind + "\n")


def _refuse(name: str) -> object:
    raise OSError(f"{name}: cannot open shared object file")


def test_read_host_counts_the_gpus_the_driver_lists(tmp_path: Path) -> None:
    """A /proc/driver/nvidia with two GPUs is a loaded driver listing 2; libcuda is not tried; the variable is read."""
    proc = tmp_path / "proc" / "driver" / "nvidia"
    for bus in ("0000:17:00.0", "0000:65:00.0"):
        (proc / "gpus" / bus).mkdir(parents=True)
    pci = tmp_path / "pci"
    _pci_function(pci, "0000:17:00.0", "0x10de", "0x030200")
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "nvidia-uvm").touch()
    host = read_host({"CUDA_VISIBLE_DEVICES": "1"}, proc_driver=proc, dev=dev, pci_devices=pci, load=_refuse)
    assert host == HostGpu(driver=True, driver_gpus=2, on_pci=True, visible_devices="1")
    (dev / "nvidia-uvm").unlink()
    assert read_host({}, proc_driver=proc, dev=dev, pci_devices=pci, load=_refuse).uvm_missing


def test_read_host_falls_back_to_loading_libcuda(tmp_path: Path) -> None:
    """Without /proc/driver/nvidia the driver counts as loaded only if libcuda.so.1 loads; the GPU count is unknown."""
    tried: list[str] = []

    def load(name: str) -> object:
        tried.append(name)
        return object()

    absent = tmp_path / "no-proc"
    # No uvm check either: a driver seen only through libcuda (WSL, some containers) has no /proc entry to go by.
    assert read_host({}, proc_driver=absent, dev=absent, pci_devices=absent, load=load) == HostGpu(driver=True)
    assert tried == ["libcuda.so.1"]
    assert read_host({}, proc_driver=absent, pci_devices=absent, load=_refuse) == HostGpu(driver=False)


def test_only_an_nvidia_display_controller_counts_as_a_gpu_on_the_bus(tmp_path: Path) -> None:
    """Intel graphics, an NVIDIA card's audio function or an unreadable entry is no GPU; an NVIDIA 3D controller is."""
    pci = tmp_path / "pci"
    _pci_function(pci, "0000:00:02.0", "0x8086", "0x030000")  # Intel graphics
    _pci_function(pci, "0000:17:00.1", "0x10de", "0x040300")  # the HDMI audio of an NVIDIA card
    (pci / "0000:18:00.0").mkdir()  # no vendor file
    absent = tmp_path / "no-proc"
    assert not read_host({}, proc_driver=absent, pci_devices=pci, load=_refuse).on_pci
    _pci_function(pci, "0000:17:00.0", "0x10DE", "0x030200")
    assert read_host({}, proc_driver=absent, pci_devices=pci, load=_refuse).on_pci


def test_cuda_libraries_follow_the_build_versions() -> None:
    """CUDA 12 with cuDNN 9 names the seven libraries TensorFlow opens; another CUDA the ones that follow its major."""
    assert cuda_libraries("12.5.1", "9") == (
        "libcudart.so.12",
        "libcublas.so.12",
        "libcublasLt.so.12",
        "libcufft.so.11",
        "libcusolver.so.11",
        "libcusparse.so.12",
        "libcudnn.so.9",
    )
    assert cuda_libraries("13.0", "9.10") == (
        "libcudart.so.13",
        "libcublas.so.13",
        "libcublasLt.so.13",
        "libcudnn.so.9",
    )
    assert cuda_libraries("", "") == ()


def test_missing_libraries_tries_the_loader_then_the_wheel_folders(tmp_path: Path) -> None:
    """A library that loads neither by soname nor from a wheel folder is missing; one in a wheel folder is found."""
    wheel = tmp_path / "nvidia" / "cublas" / "lib"
    wheel.mkdir(parents=True)
    (wheel / "libcublas.so.12").touch()
    loaded: list[str] = []

    def load(name: str) -> object:
        if "/" not in name:
            _refuse(name)
        loaded.append(name)
        return object()

    assert missing_libraries(["libcublas.so.12", "libcudnn.so.9"], [wheel], load) == ("libcudnn.so.9",)
    assert loaded == [str(wheel / "libcublas.so.12")]


def test_missing_libraries_with_the_real_dynamic_loader() -> None:
    """The real loader: the C library loads, a library that exists nowhere is reported."""
    assert missing_libraries(["libc.so.6", "libcrossover-monitor-none.so.1"], []) == ("libcrossover-monitor-none.so.1",)


def test_nvidia_wheel_dirs_finds_the_lib_folders_of_the_nvidia_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lib folders under every 'nvidia' namespace package on sys.path, as NVIDIA's wheels lay them out."""
    for package in ("cublas", "cudnn"):
        (tmp_path / "nvidia" / package / "lib").mkdir(parents=True)
    (tmp_path / "nvidia" / "notes.txt").write_text("not a package")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = nvidia_wheel_dirs()
    assert tmp_path / "nvidia" / "cublas" / "lib" in found
    assert tmp_path / "nvidia" / "cudnn" / "lib" in found


@pytest.mark.slow
def test_once_with_tensorflow_here_says_there_is_no_driver(tmp_path: Path) -> None:
    """This machine's real case end to end: a CUDA build of TensorFlow, no driver, said by `once` in text and JSON."""
    if Path("/proc/driver/nvidia").exists():
        pytest.skip("this machine has an NVIDIA driver: the case under test is a host without one")
    config = tmp_path / "config.yaml"
    # The guard off: a busy CI machine would withhold the CPU, and the no_gpu crossover with it.
    config.write_text(
        "benchmark: {sizes: [8, 32], modes: [compute], timing: {size_budget: 200ms}}\nguard: {enabled: false}\n"
    )
    command = [sys.executable, "-m", "crossover_monitor", "once", "--config", str(config)]

    def once(*flags: str) -> str:
        done = subprocess.run([*command, *flags], cwd=REPO, capture_output=True, text=True, timeout=180, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    body = json.loads(once("--json"))
    environment = body["snapshot"]["environment"]
    assert environment["cuda_build"] == "true"  # the pip wheel of TensorFlow is a CUDA build
    assert environment["gpu_problem"].startswith("no NVIDIA GPU or driver on this host")
    assert {c["state"] for c in body["snapshot"]["crossovers"]} == {"no_gpu"}
    table = once()
    assert (
        "\nno GPU: no NVIDIA GPU or driver on this host (no /proc/driver/nvidia; libcuda.so.1 does not load)" in table
    )
    assert "gpu_problem:" not in table  # said once, beside the crossovers, not again among the versions
