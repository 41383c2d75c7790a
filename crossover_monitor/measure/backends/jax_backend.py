"""The JAX backend: the only module that imports jax.

Devices are named "<platform>:<index>" in the order ``jax.devices(platform)`` lists them: "cpu:0",
and "gpu:0", "gpu:1", … for CUDA (or ROCm) GPUs, so a configured '/GPU:0' matches them as it does
TensorFlow's. Every block checks where its result lives, so a GPU timing can never silently run on
the CPU.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt

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
from crossover_monitor.model import GPU_PROBLEM, DeviceInfo, Mode, describe_point

_DTYPES = {name: np.dtype(getattr(jnp, name)) for name in ("float16", "bfloat16", "float32", "float64")}
_HostArray = npt.NDArray[Any]
# XLA status codes that mean the device, not the point, is broken.
_DEVICE_LOST = ("INTERNAL", "UNAVAILABLE", "ABORTED")


class JaxBackend:
    name = "jax"

    def __init__(self, options: BackendOptions) -> None:
        # All of this must happen before JAX starts its CPU and GPU clients (on first use, not on import).
        self._cpu_threads = _pin_cpus(options.cpu_threads)
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # as TensorFlow's memory growth
        # Without x64, float64 operands would silently become float32.
        jax.config.update("jax_enable_x64", val=True)
        precision = "tensorfloat32" if options.tf32 else "float32"
        jax.config.update("jax_default_matmul_precision", precision)

    def environment(self) -> Mapping[str, str]:
        gpus = _gpus()
        return {
            "framework": "jax",
            "framework_version": jax.__version__,
            "cuda_version": gpus[0].client.platform_version if gpus else "",
            "tf32": str(jax.default_matmul_precision.value == "tensorfloat32").lower(),
            "cpu_threads": str(self._cpu_threads),
            **({GPU_PROBLEM: _gpu_problem()} if not gpus else {}),
        }

    def discover(self) -> Sequence[DeviceInfo]:
        devices = []
        for name, device in _devices().items():
            if device.platform == "cpu":
                devices.append(cpu_device(self.name, name, self._cpu_threads))
            else:
                capability = getattr(device, "compute_capability", None)
                extra = (("compute_capability", str(capability)),) if capability else ()
                devices.append(
                    DeviceInfo(backend=self.name, device=name, kind="gpu", name=device.device_kind, details=extra)
                )
        return devices

    def prepare(self, device: DeviceInfo, size: int, dtype: str, mode: Mode) -> RunBlock:
        where = lookup_device(self.name, device.device, _devices())
        np_dtype = lookup_dtype(_DTYPES, device.device, size, dtype, mode)
        what = describe_point(size, dtype, mode)
        with _failures(where, what):
            if mode == "compute":
                # Drawn on the device itself: operands of gigabytes never pass through the host.
                key_a, key_b = jax.random.split(jax.device_put(jax.random.key(size), where))
                a = jax.random.uniform(key_a, (size, size), np_dtype)
                b = jax.random.uniform(key_b, (size, size), np_dtype)
                return _compute_block(where, what, a, b)
            a_host, b_host = (x.astype(np_dtype) for x in host_operands(size))
            return _end_to_end_block(where, what, a_host, b_host)

    def check(self, device: DeviceInfo, size: int, dtype: str, mode: Mode) -> float:
        where = lookup_device(self.name, device.device, _devices())
        np_dtype = lookup_dtype(_DTYPES, device.device, size, dtype, mode)
        what = describe_point(size, dtype, mode)
        a_host, b_host = (x.astype(np_dtype) for x in host_operands(size))
        product: npt.ArrayLike
        with _failures(where, what):
            if mode == "compute":
                product = _compute_block(where, what, jax.device_put(a_host, where), jax.device_put(b_host, where))(1)
            else:
                product = _end_to_end_block(where, what, a_host, b_host)(1)
        return relative_error(product, a_host, b_host)


def _compile(where: jax.Device, size: int, dtype: np.dtype[Any]) -> Callable[..., jax.Array]:
    """``jnp.matmul`` of two n×n operands on ``where``, compiled now: compilation never lands in a timed block."""
    sharding = jax.sharding.SingleDeviceSharding(where)
    operand = jax.ShapeDtypeStruct((size, size), dtype, sharding=sharding)
    compiled: Callable[..., jax.Array] = jax.jit(jnp.matmul).lower(operand, operand).compile()
    return compiled


def _compute_block(where: jax.Device, what: str, a: jax.Array, b: jax.Array) -> Callable[[int], jax.Array]:
    _check_placement(where, a)
    matmul = _compile(where, a.shape[0], a.dtype)

    def run(calls: int) -> jax.Array:
        with _failures(where, what):
            for _ in range(calls - 1):  # each product but the last dropped at once, as in user code
                matmul(a, b)
            c = matmul(a, b)
            # Dispatch is asynchronous, and a device runs its computations in order: the last done, all are.
            c.block_until_ready()
        _check_placement(where, c)
        return c

    return run


def _end_to_end_block(
    where: jax.Device, what: str, a_host: _HostArray, b_host: _HostArray
) -> Callable[[int], _HostArray]:
    matmul = _compile(where, a_host.shape[0], a_host.dtype)

    def run(calls: int) -> _HostArray:
        with _failures(where, what):
            # Each result but the last is dropped at once: two live host results fault in fresh pages every call.
            for _ in range(calls - 1):
                np.asarray(matmul(jax.device_put(a_host, where), jax.device_put(b_host, where)))
            c = matmul(jax.device_put(a_host, where), jax.device_put(b_host, where))
            result = np.asarray(c)  # the result back in host memory; blocks until it is there
        _check_placement(where, c)
        return result

    return run


def _name(device: jax.Device) -> str:
    """'cpu:0', 'gpu:1': the platform and the device's place in ``jax.devices(platform)``."""
    return f"{device.platform}:{jax.devices(device.platform).index(device)}"


def _devices() -> dict[str, jax.Device]:
    """The first CPU and every GPU by name; TPUs and other platforms are not timed."""
    return {_name(device): device for device in [jax.devices("cpu")[0], *_gpus()]}


def _gpus() -> list[jax.Device]:
    try:
        return list(jax.devices("gpu"))
    except RuntimeError:  # no GPU platform (CPU-only jaxlib, or no driver): JAX says so this way
        return []


def _gpu_problem() -> str:
    """Why JAX has no GPU, in a sentence with its fix."""
    plugin = _cuda_plugin()
    says = ""
    if plugin:
        try:
            jax.devices("cuda")
        except RuntimeError as exc:  # the plugin's own reason, where it failed to start
            says = str(exc).strip()
    facts = Facts(
        framework="JAX",
        host=read_host(os.environ),
        cuda_build=bool(plugin),
        build_fix="it has no CUDA plugin; pip install 'jax[cuda12]' (or jax[cuda13]) adds one, with its CUDA libraries",
        framework_says=says,
    )
    return explain(facts)


def _cuda_plugin() -> str:
    """The installed distribution of a JAX CUDA plugin (jax-cuda12-plugin, …), or ''."""
    for distribution in importlib.metadata.distributions():
        name = str(distribution.metadata["Name"] or "")
        if re.fullmatch(r"jax[-_.]cuda\d+[-_.]plugin", name, re.IGNORECASE):
            return name
    return ""


def _pin_cpus(threads: int) -> int:
    """Confine the process to ``threads`` of its CPUs and return how many it may use.

    XLA sizes its CPU thread pool from the CPUs the process may run on when its client starts;
    jaxlib has no flag for it (XLA_FLAGS' intra_op_parallelism_threads is gone). Threads started
    before this call, and a CPU client already started in this process, keep their CPUs.
    """
    allowed = sorted(os.sched_getaffinity(0))
    if threads < len(allowed):
        os.sched_setaffinity(0, allowed[:threads])
    return len(os.sched_getaffinity(0))


@contextmanager
def _failures(where: jax.Device, what: str) -> Iterator[None]:
    try:
        yield
    except RuntimeError as exc:  # jax.errors.JaxRuntimeError, which older jax does not name
        message = str(exc)
        if "RESOURCE_EXHAUSTED" in message:
            raise MeasurementFailed(_name(where), what, f"out of memory: {message}") from None
        if message.startswith(_DEVICE_LOST) or "CUDA_ERROR" in message or "CUDA error" in message:
            # e.g. an ECC error or a lost GPU: the device is broken, not this point
            raise DeviceUnavailable(_name(where), message) from None
        raise MeasurementFailed(_name(where), what, message) from None


def _check_placement(where: jax.Device, array: jax.Array) -> None:
    check_placement(_name(where), ", ".join(sorted(_name(d) for d in array.devices())))


def create(options: BackendOptions) -> JaxBackend:
    return JaxBackend(options)
