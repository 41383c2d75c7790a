"""The PyTorch backend: the only module that imports torch.

Devices are named as torch names them ("cpu", "cuda:0"); prepare accepts only those it discovered,
and every block checks where its result lives, so a GPU timing can never silently run on the CPU.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch

from crossover_monitor.errors import DeviceUnavailable, MeasurementFailed
from crossover_monitor.measure.common import (
    check_placement,
    cpu_device,
    host_operands,
    lookup_device,
    lookup_dtype,
    relative_error,
)
from crossover_monitor.measure.contract import BackendOptions, RunBlock
from crossover_monitor.measure.nogpu import Facts, explain, read_host
from crossover_monitor.model import BUILTIN_BACKENDS, GPU_PROBLEM, DeviceInfo, Mode, describe_point

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}


class TorchBackend:
    name = "torch"

    def __init__(self, options: BackendOptions) -> None:
        # Explicit both ways: torch's defaults for TF32 have changed between releases.
        torch.backends.cuda.matmul.allow_tf32 = options.tf32
        torch.backends.cudnn.allow_tf32 = options.tf32
        torch.set_float32_matmul_precision("high" if options.tf32 else "highest")
        torch.set_num_threads(options.cpu_threads)

    def environment(self) -> Mapping[str, str]:
        return {
            "framework": "torch",
            "framework_version": torch.__version__,
            "cuda_build": str(torch.version.cuda is not None).lower(),
            "cuda_version": torch.version.cuda or "",
            "cudnn_version": str(torch.backends.cudnn.version() or ""),
            "tf32": str(torch.backends.cuda.matmul.allow_tf32).lower(),
            "cpu_threads": str(torch.get_num_threads()),
            **({GPU_PROBLEM: problem} if (problem := _gpu_problem()) else {}),
        }

    def discover(self) -> Sequence[DeviceInfo]:
        devices = [cpu_device(self.name, "cpu", torch.get_num_threads())]
        for index in range(torch.cuda.device_count()):
            gpu = torch.cuda.get_device_properties(index)
            devices.append(
                DeviceInfo(
                    backend=self.name,
                    device=BUILTIN_BACKENDS[self.name].gpu_device(index),
                    kind="gpu",
                    name=gpu.name,
                    details=(
                        ("compute_capability", f"{gpu.major}.{gpu.minor}"),
                        ("memory_bytes", str(gpu.total_memory)),
                        *((("uuid", f"GPU-{gpu.uuid}"),) if getattr(gpu, "uuid", None) else ()),  # NVML's name for it
                    ),
                )
            )
        return devices

    def prepare(self, device: DeviceInfo, size: int, dtype: str, mode: Mode) -> RunBlock:
        where = self._resolve(device)
        torch_dtype = lookup_dtype(_DTYPES, device.device, size, dtype, mode)
        what = describe_point(size, dtype, mode)
        with _failures(where, what):
            if mode == "compute":
                a = torch.rand(size, size, device=where, dtype=torch_dtype)
                b = torch.rand(size, size, device=where, dtype=torch_dtype)
                return _compute_block(where, what, a, b)
            a_host, b_host = (torch.from_numpy(x).to(torch_dtype) for x in host_operands(size))
            return _end_to_end_block(where, what, a_host, b_host)

    def check(self, device: DeviceInfo, size: int, dtype: str, mode: Mode) -> float:
        where = self._resolve(device)
        torch_dtype = lookup_dtype(_DTYPES, device.device, size, dtype, mode)
        what = describe_point(size, dtype, mode)
        a_host, b_host = (torch.from_numpy(x).to(torch_dtype) for x in host_operands(size))
        if mode == "compute":
            with _failures(where, what):
                product = _compute_block(where, what, a_host.to(where), b_host.to(where))(1).cpu()
        else:
            product = _end_to_end_block(where, what, a_host, b_host)(1)
        return relative_error(*(x.double().numpy() for x in (product, a_host, b_host)))

    @functools.cached_property
    def _known(self) -> dict[str, torch.device]:
        """Discovered devices, looked up once per worker rather than once per point."""
        return {d.device: torch.device(d.device) for d in self.discover()}

    def _resolve(self, device: DeviceInfo) -> torch.device:
        return lookup_device(self.name, device.device, self._known)


def _compute_block(where: torch.device, what: str, a: torch.Tensor, b: torch.Tensor) -> Callable[[int], torch.Tensor]:
    _check_placement(where, a)

    def run(calls: int) -> torch.Tensor:
        with _failures(where, what):
            # matmul, not mm(out=c): a fresh output per call is what `A @ B` costs in user code and what
            # the TensorFlow and JAX backends pay too. Each but the last is dropped at once, as in user
            # code: keeping one alive while the next is allocated cost +45% at n=512 on the CPU (16 vCPUs).
            for _ in range(calls - 1):
                torch.matmul(a, b)
            c = torch.matmul(a, b)
            if where.type == "cuda":
                torch.cuda.synchronize(where)  # kernels return when queued; wait for them
        _check_placement(where, c)
        return c

    return run


def _end_to_end_block(
    where: torch.device, what: str, a_host: torch.Tensor, b_host: torch.Tensor
) -> Callable[[int], torch.Tensor]:
    # Pageable host memory, not pinned: that is what a model fed from ordinary host tensors pays,
    # and what the TensorFlow and JAX backends copy from; pinning would time a best case instead.
    def run(calls: int) -> torch.Tensor:
        with _failures(where, what):
            # Each result but the last is dropped at once: two live host results made every call fault in
            # fresh pages (3.8x the peer tool's time at n=2048 on an H200 machine).
            for _ in range(calls - 1):
                torch.matmul(a_host.to(where), b_host.to(where)).cpu()
            c = torch.matmul(a_host.to(where), b_host.to(where))
            result = c.cpu()  # the result back in host memory; blocks until it is there
        _check_placement(where, c)
        return result

    return run


def _gpu_problem() -> str | None:
    """Why torch sees no GPU (None when it sees one), in a sentence with its fix."""
    if torch.cuda.device_count():
        return None
    cuda_build = torch.version.cuda is not None
    says = ""
    if cuda_build:
        try:
            torch.cuda.init()  # fails with CUDA's own reason, e.g. "The NVIDIA driver on your system is too old"
        except (RuntimeError, AssertionError) as exc:
            says = str(exc).strip()
    facts = Facts(
        framework="PyTorch",
        host=read_host(os.environ),
        cuda_build=cuda_build,
        build_fix=(
            f"torch {torch.__version__} is a CPU build; install a CUDA one, e.g. pip install torch --index-url "
            "https://download.pytorch.org/whl/cu128 (pytorch.org lists the others)"
        ),
        framework_says=says,
    )
    return explain(facts)


@contextmanager
def _failures(where: torch.device, what: str) -> Iterator[None]:
    try:
        yield
    except torch.cuda.OutOfMemoryError as exc:
        raise MeasurementFailed(str(where), what, f"out of memory: {exc}") from None
    except RuntimeError as exc:
        if "CUDA error" in str(exc):  # e.g. an ECC error or a lost GPU: the device is broken, not this point
            raise DeviceUnavailable(str(where), str(exc)) from None
        raise MeasurementFailed(str(where), what, str(exc)) from None  # e.g. no kernel for this dtype here


def _check_placement(where: torch.device, tensor: torch.Tensor) -> None:
    check_placement(str(where), str(tensor.device))


def create(options: BackendOptions) -> TorchBackend:
    return TorchBackend(options)
