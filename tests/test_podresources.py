"""The kubelet's pod-resources API, served by a local gRPC server that speaks v1 as the kubelet does.

The server's answers are encoded by the protobuf library itself, from the messages of the kubelet's
api.proto (built at run time), so the hand decoder in crossover_monitor/measure/guard/podresources.py is checked
against the real wire format, unknown fields (CPU ids, NUMA topology) included.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from crossover_monitor.measure.guard.podresources import (
    LIST_METHOD,
    MAX_ANSWER_BYTES,
    MAX_PODS,
    Allocation,
    PodResourcesClient,
    PodResourcesUnavailable,
    decode_list_response,
    holders,
)

_STRING, _INT64, _MESSAGE = 9, 3, 11
_OPTIONAL, _REPEATED = 1, 3

# kubelet/pkg/apis/podresources/v1/api.proto, the messages List answers with (the fields that matter here,
# and two this code does not read, to prove they are skipped).
_MESSAGES: dict[str, list[tuple[str, int, int, int, str]]] = {
    "ListPodResourcesResponse": [("pod_resources", 1, _MESSAGE, _REPEATED, ".v1.PodResources")],
    "PodResources": [
        ("name", 1, _STRING, _OPTIONAL, ""),
        ("namespace", 2, _STRING, _OPTIONAL, ""),
        ("containers", 3, _MESSAGE, _REPEATED, ".v1.ContainerResources"),
    ],
    "ContainerResources": [
        ("name", 1, _STRING, _OPTIONAL, ""),
        ("devices", 2, _MESSAGE, _REPEATED, ".v1.ContainerDevices"),
        ("cpu_ids", 3, _INT64, _REPEATED, ""),
    ],
    "ContainerDevices": [
        ("resource_name", 1, _STRING, _OPTIONAL, ""),
        ("device_ids", 2, _STRING, _REPEATED, ""),
        ("topology", 3, _MESSAGE, _OPTIONAL, ".v1.TopologyInfo"),
    ],
    "TopologyInfo": [("nodes", 1, _MESSAGE, _REPEATED, ".v1.NUMANode")],
    "NUMANode": [("ID", 1, _INT64, _OPTIONAL, "")],
}


def _response_class() -> Any:
    file = descriptor_pb2.FileDescriptorProto(name="podresources_v1_test.proto", package="v1", syntax="proto3")
    for name, fields in _MESSAGES.items():
        message = file.message_type.add(name=name)
        for field_name, number, kind, label, type_name in fields:
            field = message.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                field.type_name = type_name
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("v1.ListPodResourcesResponse"))


def _node_with_two_jobs() -> bytes:
    response = _response_class()()
    train = response.pod_resources.add(name="train-7", namespace="ml")
    worker = train.containers.add(name="worker", cpu_ids=[2, 3])
    gpus = worker.devices.add(resource_name="nvidia.com/gpu", device_ids=["GPU-aaaa", "GPU-bbbb"])
    gpus.topology.nodes.add(ID=0)
    worker.devices.add(resource_name="example.com/nic", device_ids=["nic-0"])
    train.containers.add(name="sidecar")
    # Time-sliced: NVIDIA's device plugin hands out replicas of one GPU as GPU-<uuid>::<n>.
    shared = response.pod_resources.add(name="notebook-1", namespace="research")
    shared.containers.add(name="jupyter").devices.add(resource_name="nvidia.com/gpu", device_ids=["GPU-cccc::0"])
    other = response.pod_resources.add(name="notebook-2", namespace="research")
    other.containers.add(name="jupyter").devices.add(resource_name="nvidia.com/gpu", device_ids=["GPU-cccc::3"])
    mig = response.pod_resources.add(name="small-0", namespace="ml")
    mig.containers.add(name="job").devices.add(resource_name="nvidia.com/mig-1g.10gb", device_ids=["MIG-dddd"])
    response.pod_resources.add(name="web-0", namespace="default").containers.add(name="nginx")
    return bytes(response.SerializeToString())


@pytest.fixture
def kubelet() -> Iterator[Callable[[Callable[[bytes, grpc.ServicerContext], bytes]], str]]:
    """Starts a gRPC server on a unix socket answering List with the given function; yields its socket's path."""
    directory = tempfile.mkdtemp(prefix="kubelet-", dir="/tmp")  # a unix socket path must stay short
    servers: list[grpc.Server] = []

    def start(answer: Callable[[bytes, grpc.ServicerContext], bytes]) -> str:
        socket = f"{directory}/kubelet-{len(servers)}.sock"
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        service, method = LIST_METHOD.strip("/").split("/")
        handler = grpc.unary_unary_rpc_method_handler(
            answer, request_deserializer=lambda b: b, response_serializer=lambda b: b
        )
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, {method: handler}),))
        server.add_insecure_port(f"unix://{socket}")
        server.start()
        servers.append(server)
        return socket

    yield start
    for server in servers:
        server.stop(grace=None)
    shutil.rmtree(directory, ignore_errors=True)


def test_the_pods_holding_each_gpu_are_read_from_the_kubelet(kubelet: Any) -> None:
    """The kubelet's allocations name the pods holding each GPU by UUID; a replica id or a free GPU names none."""
    answer = _node_with_two_jobs()
    requests: list[bytes] = []

    def list_pods(request: bytes, _: grpc.ServicerContext) -> bytes:
        requests.append(request)
        return answer

    socket = kubelet(list_pods)
    assert PodResourcesClient.available(socket)
    allocations = PodResourcesClient(socket).allocations()
    assert requests == [b""]  # ListPodResourcesRequest has no fields
    assert Allocation("ml", "train-7", "worker", "nvidia.com/gpu", ("GPU-aaaa", "GPU-bbbb")) in allocations
    assert holders(allocations, "GPU-aaaa") == ["ml/train-7"]
    assert holders(allocations, "GPU-bbbb") == ["ml/train-7"]
    assert holders(allocations, "GPU-cccc") == ["research/notebook-1", "research/notebook-2"]  # time-sliced
    assert holders(allocations, "GPU-cccc::0") == []  # a replica's id is not a GPU's UUID
    assert holders(allocations, "GPU-eeee") == []
    assert holders(allocations, "nic-0") == ["ml/train-7"]


def test_a_kubelet_that_refuses_or_is_absent_is_a_clear_error(kubelet: Any, tmp_path: Path) -> None:
    """A kubelet that refuses, a missing socket or a garbled answer is PodResourcesUnavailable saying which."""

    def refuse(_: bytes, context: grpc.ServicerContext) -> bytes:
        context.abort(grpc.StatusCode.PERMISSION_DENIED, "no")
        raise AssertionError("abort raises")

    socket = kubelet(refuse)
    with pytest.raises(PodResourcesUnavailable, match=r"pod-resources API at .*: StatusCode.PERMISSION_DENIED"):
        PodResourcesClient(socket).allocations()

    missing = str(tmp_path / "kubelet.sock")
    assert not PodResourcesClient.available(missing)
    with pytest.raises(PodResourcesUnavailable, match=r"StatusCode.UNAVAILABLE"):
        PodResourcesClient(missing).allocations()

    garbage = kubelet(lambda _, __: b"\x0a\x05ab")  # a length that runs past the end
    with pytest.raises(PodResourcesUnavailable, match="is not what v1 sends: field 1 runs past the end"):
        PodResourcesClient(garbage).allocations()


def test_the_kubelet_is_asked_again_only_once_its_answer_is_old(kubelet: Any) -> None:
    """Several busy GPUs, or one busy at every look, cost one call; so does a failure (a stalled kubelet)."""
    calls: list[bytes] = []

    def list_pods(request: bytes, _: grpc.ServicerContext) -> bytes:
        calls.append(request)
        return _node_with_two_jobs()

    now = [100.0]
    client = PodResourcesClient(kubelet(list_pods), max_age_s=30, clock=lambda: now[0])
    for _ in range(5):
        client.allocations()
    assert len(calls) == 1
    now[0] += 30
    client.allocations()
    assert len(calls) == 2

    missing = PodResourcesClient("/nonexistent/kubelet.sock", max_age_s=30, clock=lambda: now[0])
    with pytest.raises(PodResourcesUnavailable) as first:
        missing.allocations()
    with pytest.raises(PodResourcesUnavailable) as again:
        missing.allocations()
    assert again.value is first.value  # the failure is remembered, not retried at every look
    now[0] += 30
    with pytest.raises(PodResourcesUnavailable) as later:
        missing.allocations()
    assert later.value is not first.value


def test_decoding_skips_fields_it_does_not_know_and_rejects_truncated_input() -> None:
    """The protobuf decoder skips unknown fields and rejects truncated input and unsupported wire types."""
    assert decode_list_response(b"") == []
    # An unknown varint field (number 9) and an unknown fixed32 (number 10) before the pods: skipped.
    assert decode_list_response(b"\x48\x01\x55\x00\x00\x00\x00" + _node_with_two_jobs())[0].pod == "train-7"
    with pytest.raises(ValueError, match="varint runs past the end"):
        decode_list_response(b"\x08")
    with pytest.raises(ValueError, match="wire type 3"):
        decode_list_response(b"\x0b")


def test_an_answer_too_big_or_an_error_with_long_details_is_refused_in_a_line(kubelet: Any) -> None:
    """Issue 34 #11: an answer just under gRPC's 4 MiB (2 million empty pods) took 23 s to decode in the worker,
    asked again every 30 s; an abort with 5 KB of details and line breaks went whole into the withheld reason
    and the log. Now the answer is capped (1 MiB, 10,000 pods) and the details abridged to one line."""
    huge = _response_class()()
    for _ in range(1_000_000):  # 2 bytes each: 2 MB, under gRPC's own 4 MiB limit
        huge.pod_resources.add()
    data = bytes(huge.SerializeToString())
    assert MAX_ANSWER_BYTES < len(data) < 4 << 20
    started = time.monotonic()
    with pytest.raises(PodResourcesUnavailable) as refused:
        PodResourcesClient(kubelet(lambda _r, _c: data)).allocations()
    assert time.monotonic() - started < 5
    assert "RESOURCE_EXHAUSTED" in str(refused.value)
    many = _response_class()()
    for index in range(MAX_PODS + 1):
        many.pod_resources.add(name=f"p{index}")
    with pytest.raises(ValueError, match="more than 10000 pods"):
        decode_list_response(bytes(many.SerializeToString()))

    def abort(_request: bytes, context: grpc.ServicerContext) -> bytes:
        context.abort(grpc.StatusCode.PERMISSION_DENIED, ("denied\n" + "x" * 100) * 50)
        return b""

    with pytest.raises(PodResourcesUnavailable) as denied:
        PodResourcesClient(kubelet(abort)).allocations()
    said = str(denied.value)
    assert "\n" not in said
    assert len(said) < 400
    assert "PERMISSION_DENIED (denied xxx" in said
