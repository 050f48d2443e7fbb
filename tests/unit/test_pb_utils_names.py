"""sluice's pb_utils has every public name of the python backend's own
``triton_python_backend_utils.py`` (Triton 2.51), so a model.py that calls one loads."""

from __future__ import annotations

import pytest

from sluice.backends.python import pb_utils

# The public module-level names of triton_python_backend_utils.py in Triton 2.51
TRITON_MODULE_NAMES = [
    "TRITON_STRING_TO_NUMPY",
    "serialize_byte_tensor",
    "deserialize_bytes_tensor",
    "get_input_tensor_by_name",
    "get_output_tensor_by_name",
    "get_input_config_by_name",
    "get_output_config_by_name",
    "using_decoupled_model_transaction_policy",
    "triton_to_numpy_type",
    "numpy_to_triton_type",
    "triton_string_to_numpy",
    "ModelConfig",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    # the C extension's names it re-exports: custom metrics, the model loading API
    "MetricFamily",
    "load_model",
    "unload_model",
    "is_model_ready",
]
# ... and the public methods of its ModelConfig
TRITON_MODEL_CONFIG_METHODS = [
    "as_dict",
    "set_max_batch_size",
    "set_dynamic_batching",
    "add_input",
    "add_output",
    "set_model_transaction_policy",
]


@pytest.mark.parametrize("name", TRITON_MODULE_NAMES)
def test_module_has_triton_name(name):
    assert hasattr(pb_utils, name)
    assert name in pb_utils.__all__


@pytest.mark.parametrize("name", TRITON_MODEL_CONFIG_METHODS)
def test_model_config_has_triton_method(name):
    assert callable(getattr(pb_utils.ModelConfig, name))


def test_using_decoupled_model_transaction_policy():
    decoupled = {"name": "m", "model_transaction_policy": {"decoupled": True}}
    assert pb_utils.using_decoupled_model_transaction_policy(decoupled) is True
    assert pb_utils.using_decoupled_model_transaction_policy({"name": "m"}) is False
    assert (
        pb_utils.using_decoupled_model_transaction_policy(
            {"model_transaction_policy": {"decoupled": False}}
        )
        is False
    )
    # the auto_complete_config object works as well as its dict
    cfg = pb_utils.ModelConfig({"name": "m"})
    assert pb_utils.using_decoupled_model_transaction_policy(cfg) is False
    cfg.set_model_transaction_policy({"decoupled": True})
    assert pb_utils.using_decoupled_model_transaction_policy(cfg.as_dict()) is True
    assert pb_utils.using_decoupled_model_transaction_policy(cfg) is True
