"""Triton's JSON form of a model config (``GET /v2/models/<m>/config``, and the
``model_config`` argument a python model's ``initialize`` receives): a pure conversion from
the ``ModelConfig`` protobuf.

Rules of this file: proto field names, every field printed, and 64-bit integers as JSON
numbers (protobuf's JSON mapping would quote them; Triton prints numbers).
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from tritonclient.grpc import model_config_pb2 as mc

__all__ = ["config_to_json_dict"]


def config_to_json_dict(config: mc.ModelConfig) -> dict[str, Any]:
    """Triton's JSON form of a ModelConfig: proto field names, every field printed, and
    64-bit integers as JSON numbers (protobuf's JSON mapping would quote them)."""
    data = json_format.MessageToDict(
        config, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    _unquote_int64(config.DESCRIPTOR, data)
    return data


_INT64_TYPES = {FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64}


def _unquote_int64(descriptor: Descriptor, data: dict[str, Any]) -> None:
    for fd in descriptor.fields:
        if fd.name not in data:
            continue
        value = data[fd.name]
        if fd.cpp_type in _INT64_TYPES:
            if isinstance(value, list):
                data[fd.name] = [int(v) for v in value]
            elif isinstance(value, dict):
                data[fd.name] = {k: int(v) for k, v in value.items()}
            else:
                data[fd.name] = int(value)
        elif fd.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
            sub = fd.message_type
            if sub.GetOptions().map_entry:
                vfd = sub.fields_by_name["value"]
                if vfd.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
                    for v in value.values():
                        _unquote_int64(vfd.message_type, v)
                elif vfd.cpp_type in _INT64_TYPES:
                    data[fd.name] = {k: int(v) for k, v in value.items()}
            elif isinstance(value, list):
                for v in value:
                    _unquote_int64(sub, v)
            elif isinstance(value, dict):
                _unquote_int64(sub, value)
