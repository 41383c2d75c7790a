"""Which pod holds a GPU, from the kubelet's pod-resources API (as dcgm-exporter names pods); the only grpc importer.

Under Kubernetes the worker runs without the host's PID namespace, so NVML's processes on a busy GPU
are host PIDs it cannot name. The kubelet knows which pod each device was allocated to: its
``v1.PodResourcesLister/List`` call, on a unix socket the DaemonSet mounts read-only, lists every
pod's containers with the device ids (GPU UUIDs, from NVIDIA's device plugin) they were given.

The few fields read are decoded from protobuf's wire format here rather than from generated code,
so the API needs no protoc step and no protobuf runtime of a particular version: only ``grpcio``.
Fields this code does not know are skipped, as protobuf does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from crossover_monitor.errors import MonitorError
from crossover_monitor.text import brief

# Where the kubelet serves the API; the DaemonSet mounts the host's directory at the same path
# (a kubelet with another --root-dir: mount its pod-resources directory here).
DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD = "/v1.PodResourcesLister/List"
_TIMEOUT_S = 2.0  # a local socket: a kubelet that takes longer is not answering
# The most of an answer taken (gRPC's default is 4 MiB, which 2 million empty pods fill and which took 23 s to
# decode): a node runs hundreds of pods, a few hundred bytes each.
MAX_ANSWER_BYTES = 1 << 20
MAX_PODS = 10_000
_DETAILS_SHOWN = 200  # of an error's details, what goes into the withheld reason and the log

# Field numbers of kubelet/pkg/apis/podresources/v1/api.proto.
_RESPONSE_POD_RESOURCES = 1  # ListPodResourcesResponse.pod_resources
_POD_NAME, _POD_NAMESPACE, _POD_CONTAINERS = 1, 2, 3  # PodResources
_CONTAINER_NAME, _CONTAINER_DEVICES = 1, 2  # ContainerResources
_DEVICES_RESOURCE_NAME, _DEVICES_IDS = 1, 2  # ContainerDevices

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5
_LOW_BITS, _MORE = 0x7F, 0x80


class PodResourcesUnavailable(MonitorError):
    """The kubelet's pod-resources API could not be asked; the message says why."""


@dataclass(frozen=True)
class Allocation:
    """One container's devices of one resource (``nvidia.com/gpu``), as the kubelet allocated them."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


def holders(allocations: Sequence[Allocation], uuid: str) -> list[str]:
    """``namespace/pod`` of every pod given the GPU with this UUID.

    NVIDIA's device plugin names a time-sliced or MPS replica ``GPU-<uuid>::<n>``, so several pods
    can hold one GPU; a MIG instance (``MIG-…``) or ``deviceIDStrategy: index`` ("0") names none.
    """
    return sorted(
        {f"{a.namespace}/{a.pod}" for a in allocations if any(d.split("::")[0] == uuid for d in a.device_ids)}
    )


class PodResourcesClient:
    """Asks the kubelet again once its last answer (or failure) is ``max_age_s`` old: pods come and go,
    but a sweep that finds several GPUs busy, or one busy at every look, asks once, and a kubelet that
    stalls costs a sweep one deadline, not one per look."""

    def __init__(
        self, socket_path: str = DEFAULT_SOCKET, *, max_age_s: float = 30.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._socket_path = socket_path
        self._max_age_s = max_age_s
        self._clock = clock
        self._last: tuple[float, list[Allocation] | PodResourcesUnavailable] | None = None

    def allocations(self) -> list[Allocation]:
        now = self._clock()
        if self._last is None or now - self._last[0] >= self._max_age_s:
            try:
                self._last = (now, self._ask())
            except PodResourcesUnavailable as exc:
                self._last = (now, exc)
        answer = self._last[1]
        if isinstance(answer, PodResourcesUnavailable):
            raise answer
        return answer

    @staticmethod
    def available(socket_path: str = DEFAULT_SOCKET) -> bool:
        """Whether the socket is there (the node runs Kubernetes and the DaemonSet mounted it)."""
        return Path(socket_path).exists()

    def _ask(self) -> list[Allocation]:
        try:
            import grpc  # noqa: PLC0415 - loaded only where the socket is
        except ImportError:
            raise PodResourcesUnavailable("grpcio is not installed (pip install grpcio)") from None
        try:
            options = [("grpc.max_receive_message_length", MAX_ANSWER_BYTES)]
            with grpc.insecure_channel(f"unix://{self._socket_path}", options=options) as channel:
                call = channel.unary_unary(LIST_METHOD, request_serializer=lambda _: b"", response_deserializer=bytes)
                response = call(None, timeout=_TIMEOUT_S)
        except grpc.RpcError as exc:
            status = exc.code() if hasattr(exc, "code") else None
            details = exc.details() if hasattr(exc, "details") else ""
            # A socket there but refused is usually its owner, root: deploy/kubernetes/pod-names says why.
            said = f" ({brief(' '.join(str(details).split()), _DETAILS_SHOWN)})" if details else ""
            raise PodResourcesUnavailable(
                f"the kubelet's pod-resources API at {self._socket_path}: {status}{said}"
            ) from None
        try:
            return decode_list_response(response)
        except ValueError as exc:
            raise PodResourcesUnavailable(f"the kubelet's pod-resources answer is not what v1 sends: {exc}") from None


def decode_list_response(data: bytes) -> list[Allocation]:
    """A ListPodResourcesResponse's allocations; ValueError if the bytes are not protobuf."""
    found: list[Allocation] = []
    pods = 0
    for number, pod in _fields(data):
        if number != _RESPONSE_POD_RESOURCES or not isinstance(pod, bytes):
            continue
        pods += 1
        if pods > MAX_PODS:
            raise ValueError(f"more than {MAX_PODS} pods on one node")
        strings = _strings(pod, (_POD_NAME, _POD_NAMESPACE))
        for container in _messages(pod, _POD_CONTAINERS):
            (container_name,) = _strings(container, (_CONTAINER_NAME,))
            for devices in _messages(container, _CONTAINER_DEVICES):
                (resource,) = _strings(devices, (_DEVICES_RESOURCE_NAME,))
                ids = tuple(v.decode() for n, v in _fields(devices) if n == _DEVICES_IDS and isinstance(v, bytes))
                found.append(Allocation(strings[1], strings[0], container_name, resource, ids))
    return found


def _strings(message: bytes, numbers: tuple[int, ...]) -> list[str]:
    """The last value of each string field (protobuf's rule for a repeated scalar read as one), or ""."""
    values = dict.fromkeys(numbers, "")
    for number, value in _fields(message):
        if number in values and isinstance(value, bytes):
            values[number] = value.decode()
    return [values[n] for n in numbers]


def _messages(message: bytes, number: int) -> Iterator[bytes]:
    return (value for n, value in _fields(message) if n == number and isinstance(value, bytes))


def _fields(data: bytes) -> Iterator[tuple[int, bytes | int]]:
    """(field number, value) of each field: bytes for length-delimited ones, an int for the others."""
    at = 0
    while at < len(data):
        tag, at = _varint(data, at)
        number, wire = tag >> 3, tag & 7
        if wire == _VARINT:
            value, at = _varint(data, at)
            yield number, value
        elif wire == _LENGTH:
            length, at = _varint(data, at)
            if at + length > len(data):
                raise ValueError(f"field {number} runs past the end")
            yield number, data[at : at + length]
            at += length
        elif wire in (_FIXED64, _FIXED32):
            width = 8 if wire == _FIXED64 else 4
            if at + width > len(data):
                raise ValueError(f"field {number} runs past the end")
            yield number, int.from_bytes(data[at : at + width], "little")
            at += width
        else:
            raise ValueError(f"field {number} has wire type {wire}, which v1 does not use")


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data):
            raise ValueError("a varint runs past the end")
        byte = data[at]
        at += 1
        value |= (byte & _LOW_BITS) << shift
        if not byte & _MORE:
            return value, at
        shift += 7
        if shift > 63:  # noqa: PLR2004 - a varint is at most 10 bytes
            raise ValueError("a varint longer than 64 bits")
