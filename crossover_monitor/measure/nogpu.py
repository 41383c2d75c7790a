"""Why a framework found no GPU: what the host shows whatever the framework, and the sentence naming cause and fix.

``explain`` is pure; the readers take their paths, environment and library loader as arguments. The
backends call them only when their framework found no GPU, adding what the framework knows (whether it
is a CUDA build, which libraries it needs), so this module imports no framework.
"""

from __future__ import annotations

import ctypes
import importlib.util
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

PROC_DRIVER = Path("/proc/driver/nvidia")
DEV = Path("/dev")
PCI_DEVICES = Path("/sys/bus/pci/devices")
_NVIDIA_VENDOR = "0x10de"
# PCI base class 03: display controllers (VGA 0x0300, 3D 0x0302); not the GPUs' audio functions or NVSwitches.
_DISPLAY_CLASS = re.compile(r"0x03[0-9a-f]{4}")
# What a container or a GPU host without its driver is missing, for every "no driver" sentence.
_DRIVER_FIX = (
    "install NVIDIA's driver (nvidia-smi should then list the GPU), or give the container the GPU with the NVIDIA "
    "Container Toolkit (--gpus all; in Kubernetes, NVIDIA's device plugin)"
)

Loader = Callable[[str], object]  # ctypes.CDLL: loads a shared library by soname or path, OSError if it cannot


@dataclass(frozen=True, kw_only=True)
class HostGpu:
    """What the host shows about NVIDIA GPUs, read without CUDA."""

    driver: bool  # NVIDIA's kernel driver is loaded (/proc/driver/nvidia) or its user library libcuda.so.1 loads
    driver_gpus: int | None = None  # GPUs the driver lists in /proc/driver/nvidia/gpus; None where it cannot be read
    on_pci: bool = False  # an NVIDIA display or 3D controller is on the PCI bus, driver or not
    visible_devices: str | None = None  # CUDA_VISIBLE_DEVICES as set; None when unset
    # The driver's /proc entry is there but /dev/nvidia-uvm is not: CUDA cannot start (nvidia-modprobe -u makes it).
    uvm_missing: bool = False


@dataclass(frozen=True, kw_only=True)
class Facts:
    """What one framework, which found no GPU, and the host observed."""

    framework: str  # as the sentence names it: "TensorFlow", "PyTorch", "JAX"
    host: HostGpu
    cuda_build: bool  # the framework as installed can use CUDA (a CUDA build, a CUDA plugin)
    build_fix: str  # how to get a CUDA-capable install of this framework
    missing_libraries: tuple[str, ...] = ()  # CUDA libraries the build needs that do not load
    libraries_fix: str = ""  # how to get them
    framework_says: str = ""  # the framework's own words on why, where it gave any


def hides_every_gpu(visible_devices: str | None, driver_gpus: int | None) -> bool:
    """Whether CUDA_VISIBLE_DEVICES leaves CUDA no GPU.

    CUDA reads the list up to its first entry that names no GPU, so it hides every GPU when that first
    entry is empty, negative (``-1``), an index the driver does not have, or neither an index nor a
    ``GPU-``/``MIG-`` UUID. UUIDs are not checked against the driver.
    """
    if visible_devices is None:
        return False
    first = visible_devices.split(",")[0].strip()
    if re.fullmatch(r"-?\d+", first):
        index = int(first)
        return index < 0 or (driver_gpus is not None and index >= driver_gpus)
    return not first.startswith(("GPU-", "MIG-"))


def explain(facts: Facts) -> str:
    """The cause, and what to do about it, in one sentence; the first that applies of:

    no driver (an NVIDIA GPU on the PCI bus or not), CUDA_VISIBLE_DEVICES hiding every GPU, a CPU-only
    install of the framework, CUDA libraries that do not load, no /dev/nvidia-uvm, and none of these (then
    the framework's own words).
    """
    host = facts.host
    if not host.driver:
        return _no_driver(on_pci=host.on_pci)
    if hides_every_gpu(host.visible_devices, host.driver_gpus):
        listed = f", the driver lists {host.driver_gpus}" if host.driver_gpus is not None else ""
        return (
            f"CUDA_VISIBLE_DEVICES={host.visible_devices!r} hides every GPU from this process{listed}: unset it, "
            "or set it to the GPUs to time (e.g. CUDA_VISIBLE_DEVICES=0)"
        )
    says = f" ({facts.framework} says: {facts.framework_says})" if facts.framework_says else ""
    if not facts.cuda_build:
        return (
            f"{facts.framework} as installed here is CPU-only, although the NVIDIA driver is loaded: {facts.build_fix}"
        )
    if facts.missing_libraries:
        return (
            f"{facts.framework} is a CUDA build and the NVIDIA driver is loaded, but CUDA libraries it needs do not "
            f"load ({', '.join(facts.missing_libraries)}){says}: {facts.libraries_fix}"
        )
    if host.uvm_missing:
        return (
            f"the NVIDIA driver is loaded but /dev/nvidia-uvm, which CUDA needs, is missing{says}: create it with "
            "`sudo nvidia-modprobe -u -c=0` (once per boot, before the service starts); in a container, the NVIDIA "
            "Container Toolkit passes it in"
        )
    return (
        f"{facts.framework} is a CUDA build, the NVIDIA driver is loaded and the CUDA libraries load, yet it found "
        f"no GPU{says}: check that nvidia-smi lists the GPU and that the driver is new enough for this build's CUDA; "
        "`crossover-monitor --log-level debug once` shows the framework's own messages"
    )


def _no_driver(*, on_pci: bool) -> str:
    why = "no /proc/driver/nvidia; libcuda.so.1 does not load"
    if on_pci:
        return f"an NVIDIA GPU is on the PCI bus but no NVIDIA driver is loaded ({why}): {_DRIVER_FIX}"
    return (
        f"no NVIDIA GPU or driver on this host ({why}): fine on a CPU-only machine, which is timed alone; "
        f"on a GPU machine, {_DRIVER_FIX}"
    )


def read_host(
    environ: Mapping[str, str],
    *,
    proc_driver: Path = PROC_DRIVER,
    dev: Path = DEV,
    pci_devices: Path = PCI_DEVICES,
    load: Loader = ctypes.CDLL,
) -> HostGpu:
    """The host's side of ``Facts``: the driver, the GPUs it lists, NVIDIA display controllers, CUDA_VISIBLE_DEVICES."""
    driver = proc_driver.is_dir()
    uvm_missing = driver and not (dev / "nvidia-uvm").exists()
    gpus = None
    if driver:
        try:
            gpus = sum(1 for _ in (proc_driver / "gpus").iterdir())
        except OSError:
            gpus = None
    else:
        driver = _loads(load, "libcuda.so.1")  # a driver whose /proc entry is hidden (WSL, some containers)
    return HostGpu(
        driver=driver,
        driver_gpus=gpus,
        on_pci=_nvidia_on_pci(pci_devices),
        visible_devices=environ.get("CUDA_VISIBLE_DEVICES"),
        uvm_missing=uvm_missing,
    )


def _nvidia_on_pci(pci_devices: Path) -> bool:
    try:
        functions = list(pci_devices.iterdir())
    except OSError:
        return False
    for function in functions:
        try:
            vendor = (function / "vendor").read_text().strip().lower()
            kind = (function / "class").read_text().strip().lower()
        except OSError:
            continue
        if vendor == _NVIDIA_VENDOR and _DISPLAY_CLASS.fullmatch(kind):
            return True
    return False


def cuda_libraries(cuda_version: str, cudnn_version: str) -> tuple[str, ...]:
    """The sonames of the CUDA libraries a framework built for these versions opens (runtime, cuBLAS, … cuDNN).

    cuFFT, cuSOLVER and cuSPARSE number their sonames apart from CUDA: they are named for CUDA 12 only,
    the release TensorFlow ≥ 2.15 is built with; for any other the runtime and cuBLAS, which follow
    CUDA's major version, stand for them.
    """
    major = cuda_version.partition(".")[0]
    names: list[str] = []
    if major.isdigit():
        names += [f"libcudart.so.{major}", f"libcublas.so.{major}", f"libcublasLt.so.{major}"]
    if major == "12":
        names += ["libcufft.so.11", "libcusolver.so.11", "libcusparse.so.12"]
    cudnn_major = cudnn_version.partition(".")[0]
    if cudnn_major.isdigit():
        names.append(f"libcudnn.so.{cudnn_major}")
    return tuple(names)


def nvidia_wheel_dirs() -> list[Path]:
    """The ``lib`` folders of NVIDIA's pip wheels (nvidia-cublas-cu12, …), as tensorflow[and-cuda] installs them."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    if spec is None or spec.submodule_search_locations is None:
        return []
    return sorted(lib for root in spec.submodule_search_locations for lib in Path(root).glob("*/lib") if lib.is_dir())


def missing_libraries(sonames: Iterable[str], search: Sequence[Path], load: Loader = ctypes.CDLL) -> tuple[str, ...]:
    """The sonames that load neither as the dynamic loader finds them nor from one of the ``search`` folders.

    A library the framework already loaded counts as loadable: the loader matches it by its soname.
    """
    missing = []
    for soname in sonames:
        candidates = [soname, *(str(folder / soname) for folder in search if (folder / soname).exists())]
        if not any(_loads(load, candidate) for candidate in candidates):
            missing.append(soname)
    return tuple(missing)


def _loads(load: Loader, name: str) -> bool:
    try:
        load(name)
    except OSError:
        return False
    return True
