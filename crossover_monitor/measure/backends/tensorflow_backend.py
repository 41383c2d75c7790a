"""The TensorFlow backend: the only module that imports tensorflow.

Soft placement is off and every block checks where its result lives, so a GPU timing can
never silently run on the CPU.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import numpy as np
import numpy.typing as npt
import tensorflow as tf

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
from crossover_monitor.measure.nogpu import (
    Facts,
    cuda_libraries,
    explain,
    missing_libraries,
    nvidia_wheel_dirs,
    read_host,
)
from crossover_monitor.model import BUILTIN_BACKENDS, GPU_PROBLEM, WORK_STEALING, DeviceInfo, Mode, describe_point

_DTYPES = {"float16": tf.float16, "bfloat16": tf.bfloat16, "float32": tf.float32, "float64": tf.float64}
_CUDA_EXTRA = (
    "install the cuda extra, pip install 'crossover-monitor[cuda]' (tensorflow[and-cuda]: the CUDA, cuBLAS and "
    "cuDNN libraries this TensorFlow was built with, as NVIDIA's wheels); ./scripts/run does so where it sees an "
    "NVIDIA GPU"
)


def _short_name(full: str) -> str:
    """'/job:localhost/replica:0/task:0/device:GPU:0' -> '/GPU:0'."""
    return "/" + full.rsplit("device:", 1)[-1]


class TensorFlowBackend:
    name = "tensorflow"

    def __init__(self, options: BackendOptions) -> None:
        # All of this must happen before TensorFlow initialises its devices.
        for gpu in tf.config.list_physical_devices("GPU"):
            tf.config.experimental.set_memory_growth(gpu, enable=True)
        tf.config.threading.set_intra_op_parallelism_threads(options.cpu_threads)
        tf.config.threading.set_inter_op_parallelism_threads(min(2, options.cpu_threads))
        tf.config.set_soft_device_placement(enabled=False)
        tf.config.experimental.enable_tensor_float_32_execution(enabled=options.tf32)
        self._options = options

    def environment(self) -> Mapping[str, str]:
        build = tf.sysconfig.get_build_info()
        return {
            "framework": "tensorflow",
            "framework_version": tf.__version__,
            "cuda_build": str(bool(build.get("is_cuda_build"))).lower(),
            "cuda_version": str(build.get("cuda_version", "")),
            "cudnn_version": str(build.get("cudnn_version", "")),
            "tf32": str(tf.config.experimental.tensor_float_32_execution_enabled()).lower(),
            "cpu_threads": str(tf.config.threading.get_intra_op_parallelism_threads()),
            **({GPU_PROBLEM: problem} if (problem := _gpu_problem(build)) else {}),
        }

    @functools.cached_property
    def _known(self) -> dict[str, str]:
        """Discovered device names, looked up once per worker rather than once per point."""
        return {d.device: d.device for d in self.discover()}

    def discover(self) -> Sequence[DeviceInfo]:
        # Eigen's pool: a thread a neighbour holds up has its share taken by the others (one busy core beside
        # 15 threads on 16 vCPUs: 0.97-1.02x of idle, benchmarks/README.md "TensorFlow's pool").
        devices = [cpu_device(self.name, "/CPU:0", self._options.cpu_threads, thread_pool=WORK_STEALING)]
        for index, gpu in enumerate(tf.config.list_physical_devices("GPU")):
            details = tf.config.experimental.get_device_details(gpu)
            capability = details.get("compute_capability")
            extra = (("compute_capability", "{}.{}".format(*capability)),) if capability else ()
            devices.append(
                DeviceInfo(
                    backend=self.name,
                    device=BUILTIN_BACKENDS[self.name].gpu_device(index),
                    kind="gpu",
                    name=str(details.get("device_name", "GPU")),
                    details=extra,
                )
            )
        return devices

    def prepare(self, device: DeviceInfo, size: int, dtype: str, mode: Mode) -> RunBlock:
        where = lookup_device(self.name, device.device, self._known)
        tf_dtype = lookup_dtype(_DTYPES, where, size, dtype, mode)
        what = describe_point(size, dtype, mode)
        with _failures(where, what):
            if mode == "compute":
                with tf.device(where):
                    a = tf.random.uniform((size, size), dtype=tf_dtype)
                    b = tf.random.uniform((size, size), dtype=tf_dtype)
                return _compute_block(where, what, a, b)
            a_host, b_host = (x.astype(tf_dtype.as_numpy_dtype) for x in host_operands(size))
            return _end_to_end_block(where, what, a_host, b_host)

    def check(self, device: DeviceInfo, size: int, dtype: str, mode: Mode) -> float:
        where = lookup_device(self.name, device.device, self._known)
        tf_dtype = lookup_dtype(_DTYPES, where, size, dtype, mode)
        what = describe_point(size, dtype, mode)
        a_host, b_host = (x.astype(tf_dtype.as_numpy_dtype) for x in host_operands(size))
        if mode == "compute":
            with _failures(where, what), tf.device(where):
                a, b = tf.identity(a_host), tf.identity(b_host)
            product = _compute_block(where, what, a, b)(1).numpy()
        else:
            product = _end_to_end_block(where, what, a_host, b_host)(1)
        return relative_error(product, a_host, b_host)


def _compute_block(where: str, what: str, a: tf.Tensor, b: tf.Tensor) -> Callable[[int], tf.Tensor]:
    _check_placement(where, a)

    def run(calls: int) -> tf.Tensor:
        with _failures(where, what), tf.device(where):
            for _ in range(calls - 1):  # each product but the last dropped at once, as in user code
                tf.matmul(a, b)
            c = tf.matmul(a, b)
            tf.test.experimental.sync_devices()  # GPU ops return when queued; wait for them
        _check_placement(where, c)
        return c

    return run


def _end_to_end_block(
    where: str, what: str, a_host: npt.NDArray[np.generic], b_host: npt.NDArray[np.generic]
) -> Callable[[int], npt.NDArray[np.generic]]:
    def run(calls: int) -> npt.NDArray[np.generic]:
        with _failures(where, what):
            with tf.device(where):
                # An eager constant is created on the device in scope: one copy from host memory per
                # operand (identity() would add an op dispatch, and on the CPU a second copy). Each result
                # but the last is dropped at once: two live host results fault in fresh pages every call.
                for _ in range(calls - 1):
                    tf.matmul(tf.constant(a_host), tf.constant(b_host)).numpy()
                c = tf.matmul(tf.constant(a_host), tf.constant(b_host))
            result: npt.NDArray[np.generic] = c.numpy()  # the result back in host memory; blocks until it is there
        _check_placement(where, c)
        return result

    return run


def _gpu_problem(build: Mapping[str, object]) -> str | None:
    """Why TensorFlow registered no GPU (None when it has one), in a sentence with its fix."""
    if tf.config.list_physical_devices("GPU"):
        return None
    host = read_host(os.environ)
    cuda_build = bool(build.get("is_cuda_build"))
    missing: tuple[str, ...] = ()
    if host.driver and cuda_build:  # what TensorFlow logs as "Cannot dlopen some GPU libraries"
        wanted = cuda_libraries(str(build.get("cuda_version", "")), str(build.get("cudnn_version", "")))
        missing = missing_libraries(wanted, nvidia_wheel_dirs())
    build_fix = _CUDA_EXTRA
    if _installed("tensorflow-cpu"):
        build_fix = f"tensorflow-cpu is installed: pip uninstall tensorflow-cpu, then {_CUDA_EXTRA}"
    facts = Facts(
        framework="TensorFlow",
        host=host,
        cuda_build=cuda_build,
        build_fix=build_fix,
        missing_libraries=missing,
        libraries_fix=_CUDA_EXTRA,
    )
    return explain(facts)


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@contextmanager
def _failures(where: str, what: str) -> Iterator[None]:
    try:
        yield
    except tf.errors.ResourceExhaustedError as exc:
        raise MeasurementFailed(where, what, f"out of memory: {exc.message}") from None
    except (tf.errors.InternalError, tf.errors.UnavailableError, tf.errors.AbortedError) as exc:
        # e.g. a CUDA or ECC error, a lost GPU: the device is broken, not this point
        raise DeviceUnavailable(where, exc.message) from None
    except tf.errors.OpError as exc:  # e.g. no kernel for this dtype on this device
        raise MeasurementFailed(where, what, exc.message) from None


def _check_placement(where: str, tensor: tf.Tensor) -> None:
    check_placement(where, _short_name(tensor.device))


def create(options: BackendOptions) -> TensorFlowBackend:
    return TensorFlowBackend(options)
