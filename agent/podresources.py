"""The kubelet's PodResources API (v1 `List`), read from its pod-resources socket: which devices
each pod's containers hold, device-plugin and DRA. The agent publishes the answer beside its
inventory (placement/podresources.py); `gpuplace import` reads it.

The messages are built at import from their descriptor (the fields of
k8s.io/kubelet/pkg/apis/podresources/v1/api.proto that gpuplace reads, with their numbers), so no
generated code is vendored; protobuf skips the fields it is not told of.
"""

from __future__ import annotations

import os
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory

from placement.podresources import PodResources, from_list_response
from placement.types import NodeName

LIST_METHOD = "/v1.PodResourcesLister/List"

_T = descriptor_pb2.FieldDescriptorProto
_FIELDS: dict[str, list[tuple[str, int, int, str]]] = {
    # message: (field, number, type, message type of a message field)
    "ListPodResourcesRequest": [],
    "ListPodResourcesResponse": [("pod_resources", 1, _T.TYPE_MESSAGE, "PodResources")],
    "PodResources": [
        ("name", 1, _T.TYPE_STRING, ""),
        ("namespace", 2, _T.TYPE_STRING, ""),
        ("containers", 3, _T.TYPE_MESSAGE, "ContainerResources"),
    ],
    "ContainerResources": [
        ("name", 1, _T.TYPE_STRING, ""),
        ("devices", 2, _T.TYPE_MESSAGE, "ContainerDevices"),
        ("dynamic_resources", 5, _T.TYPE_MESSAGE, "DynamicResource"),
    ],
    "ContainerDevices": [
        ("resource_name", 1, _T.TYPE_STRING, ""),
        ("device_ids", 2, _T.TYPE_STRING, ""),
    ],
    "DynamicResource": [
        ("claim_name", 2, _T.TYPE_STRING, ""),
        ("claim_namespace", 3, _T.TYPE_STRING, ""),
        ("claim_resources", 4, _T.TYPE_MESSAGE, "ClaimResource"),
    ],
    "ClaimResource": [
        ("driver_name", 2, _T.TYPE_STRING, ""),
        ("pool_name", 3, _T.TYPE_STRING, ""),
        ("device_name", 4, _T.TYPE_STRING, ""),
    ],
}
#: Fields that repeat (the rest are singular).
_REPEATED = {
    "pod_resources",
    "containers",
    "devices",
    "device_ids",
    "dynamic_resources",
    "claim_resources",
}


def _messages() -> dict[str, Any]:
    proto = descriptor_pb2.FileDescriptorProto(
        name="gpuplace/podresources/v1.proto", package="v1", syntax="proto3"
    )
    for message, fields in _FIELDS.items():
        mp = proto.message_type.add(name=message)
        for name, number, kind, type_name in fields:
            label = _T.LABEL_REPEATED if name in _REPEATED else _T.LABEL_OPTIONAL
            field = mp.field.add(name=name, number=number, type=kind, label=label)
            if type_name:
                field.type_name = f".v1.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"v1.{name}"))
        for name in _FIELDS
    }


_MESSAGES = _messages()


class PodResourcesError(Exception):
    """The kubelet's socket could not be read; the message says why."""


def list_pod_resources(socket: str, node: NodeName, timeout_seconds: float = 5.0) -> PodResources:
    """One `List` call on the kubelet's pod-resources socket."""
    if not os.path.exists(socket):
        raise PodResourcesError(f"no kubelet pod-resources socket at {socket}")
    request_type = _MESSAGES["ListPodResourcesRequest"]
    response_type = _MESSAGES["ListPodResourcesResponse"]
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        call: Any = channel.unary_unary(
            LIST_METHOD,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response_type.FromString,
        )
        try:
            response = call(request_type(), timeout=timeout_seconds)
        except grpc.RpcError as exc:
            raise PodResourcesError(f"kubelet pod resources at {socket}: {exc}") from exc
    as_dict = json_format.MessageToDict(response, preserving_proto_field_name=True)
    return from_list_response(node, as_dict)


def encode_response(pods: list[dict[str, Any]]) -> bytes:
    """A ListPodResourcesResponse's bytes (protobuf field names): what a kubelet answers, for
    a stand-in kubelet in tests."""
    message = _MESSAGES["ListPodResourcesResponse"]()
    json_format.ParseDict({"pod_resources": pods}, message)
    data: bytes = message.SerializeToString()
    return data
