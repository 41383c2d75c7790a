"""The TensorFlow backend: the only module that imports tensorflow.

Soft placement is off and every block checks where its result lives, so a GPU timing can
never silently run on the CPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import tensorflow as tf

from monitor.bench.contract import BackendOptions, RunBlock
from monitor.bench.hostinfo import cpu_model
from monitor.errors import MeasurementFailed, PlacementError
from monitor.model import DeviceInfo, Mode

_DTYPES = {"float16": tf.float16, "bfloat16": tf.bfloat16, "float32": tf.float32, "float64": tf.float64}


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
        }

    def discover(self) -> Sequence[DeviceInfo]:
        devices = [
            DeviceInfo(
                backend=self.name,
                device="/CPU:0",
                kind="cpu",
                name=cpu_model(),
                details=(("threads", str(self._options.cpu_threads)),),
            )
        ]
        for index, gpu in enumerate(tf.config.list_physical_devices("GPU")):
            details = tf.config.experimental.get_device_details(gpu)
            capability = details.get("compute_capability")
            extra = (("compute_capability", "{}.{}".format(*capability)),) if capability else ()
            devices.append(
                DeviceInfo(
                    backend=self.name,
                    device=f"/GPU:{index}",
                    kind="gpu",
                    name=str(details.get("device_name", "GPU")),
                    details=extra,
                )
            )
        return devices

    def prepare(self, device: DeviceInfo, size: int, dtype: str, mode: Mode) -> RunBlock:
        where = device.device
        tf_dtype = _DTYPES[dtype]
        try:
            if mode == "compute":
                return self._compute_block(where, size, tf_dtype)
            return self._end_to_end_block(where, size, tf_dtype)
        except tf.errors.ResourceExhaustedError as exc:
            raise MeasurementFailed(where, f"{size}x{size} {dtype} {mode}", f"out of memory: {exc.message}") from None

    def _compute_block(self, where: str, size: int, tf_dtype: tf.DType) -> RunBlock:
        with tf.device(where):
            a = tf.random.uniform((size, size), dtype=tf_dtype)
            b = tf.random.uniform((size, size), dtype=tf_dtype)
        _check_placement(where, a)

        def run(calls: int) -> None:
            with tf.device(where):
                for _ in range(calls):
                    c = tf.matmul(a, b)
            tf.test.experimental.sync_devices()  # GPU ops return when queued; wait for them
            _check_placement(where, c)

        return run

    def _end_to_end_block(self, where: str, size: int, tf_dtype: tf.DType) -> RunBlock:
        rng = np.random.default_rng(size)
        numpy_dtype = tf_dtype.as_numpy_dtype
        a_host = rng.random((size, size), dtype=np.float32).astype(numpy_dtype)
        b_host = rng.random((size, size), dtype=np.float32).astype(numpy_dtype)

        def run(calls: int) -> None:
            for _ in range(calls):
                with tf.device(where):
                    # identity() under the device scope copies the host operand to the device.
                    c = tf.matmul(tf.identity(a_host), tf.identity(b_host))
                c.numpy()  # the result back in host memory; blocks until it is there
            _check_placement(where, c)

        return run


def _check_placement(where: str, tensor: tf.Tensor) -> None:
    actual = _short_name(tensor.device)
    if actual.lower() != where.lower():
        raise PlacementError(where, actual)


def create(options: BackendOptions) -> TensorFlowBackend:
    return TensorFlowBackend(options)
