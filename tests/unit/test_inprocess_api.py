"""The in-process API's pure parts: its names, the settings onto the CLI's flags, inputs
from numpy and DLPack, outputs as numpy arrays, errors by status. No server is started."""

from __future__ import annotations

import numpy as np
import pytest

import sluice
import sluice.api
from sluice.api.errors import from_server_error
from sluice.api.settings import TRITON_NAMES, _flags, config_from_settings
from sluice.api.tensor import Tensor, as_input
from sluice.cli import serve_config
from sluice.errors import InvalidArgument, Overloaded, ServerError, Status


def test_root_exports_the_api_names():
    assert set(sluice._API) == set(sluice.api.__all__)
    for name in sluice.api.__all__:
        assert getattr(sluice, name) is getattr(sluice.api, name)
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        sluice.Nope  # noqa: B018


def test_every_flag_and_triton_name_is_a_setting():
    flags = _flags()
    assert "model_repository" in flags and "model_store" in flags  # the flag and its alias
    assert "grpc_keepalive_time" in flags and "api_keys_file" in flags
    for triton, ours in TRITON_NAMES.items():
        assert ours in flags, triton
        assert triton not in flags, triton  # an alias never hides a flag


def test_settings_values(tmp_path):
    cfg = config_from_settings(
        {
            "model_repository": [tmp_path, str(tmp_path)],
            "disable_auto_complete_config": True,
            "allow_cpu_metrics": False,
            "http_port": 0,
            "rate_limiter_mode": "execution_count",
            "trace_config": ("level=TIMESTAMPS", "rate=10"),
        }
    )
    assert cfg.model_repositories == (tmp_path, tmp_path)
    assert cfg.disable_auto_complete_config is True
    assert cfg.allow_cpu_metrics is False and cfg.http_port == 0
    assert cfg.rate_limit == "execution_count"
    assert cfg.trace_config == (("", "level", "TIMESTAMPS"), ("", "rate", "10"))
    # the caller's loop thread is not held to one CPU unless asked (sluice serve's default: 64)
    assert cfg.grpc_edge_colocate == 0
    assert serve_config(["--model-repository", str(tmp_path)]).grpc_edge_colocate == 64
    asked = {"model_repository": tmp_path, "grpc_edge_colocate": 16}
    assert config_from_settings(asked).grpc_edge_colocate == 16
    with pytest.raises(sluice.InvalidArgumentError, match="takes one value"):
        config_from_settings({"model_repository": tmp_path, "http_port": [1, 2]})
    with pytest.raises(sluice.InvalidArgumentError, match="expected True or False"):
        config_from_settings({"model_repository": tmp_path, "disable_auto_complete_config": "yes"})
    with pytest.raises(sluice.InvalidArgumentError, match="expected true or false, got 'maybe'"):
        config_from_settings({"model_repository": tmp_path, "strict_readiness": "maybe"})
    with pytest.raises(sluice.InvalidArgumentError, match="a dict maps a name to a dict"):
        config_from_settings({"model_repository": tmp_path, "backend_config": {"python": 1}})


def test_inputs_from_numpy_lists_and_strings():
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    arr, dt = as_input("x", a)
    assert arr is a and dt == "INT32"
    arr, dt = as_input("x", a[:, ::2])  # not contiguous: made so
    assert dt == "INT32" and arr.flags.c_contiguous and arr.tolist() == [[0, 2], [4, 6], [8, 10]]
    arr, dt = as_input("x", [[1.5, 2.5]])
    assert dt == "FP64" and arr.shape == (1, 2)
    for text in (np.array([["ab", "é"]]), np.array([[b"ab", "é".encode()]]), [["ab", "é"]]):
        arr, dt = as_input("t", text)
        assert dt == "BYTES" and arr.dtype == object
        assert arr.tolist() == [[b"ab", "é".encode()]]
    with pytest.raises(InvalidArgument, match="input 'c': numpy dtype complex128 has no Triton"):
        as_input("c", np.zeros(2, dtype=np.complex128))


class _OnDevice:
    """A DLPack producer whose memory is on a CUDA device (2 = kDLCUDA)."""

    def __dlpack__(self, stream=None):
        raise BufferError("the tensor is on cuda:0")

    def __dlpack_device__(self):
        return (2, 0)


def test_dlpack_inputs():
    a = np.ones((2, 2), dtype=np.float16)

    class Producer:
        def __dlpack__(self, stream=None):
            return a.__dlpack__()

        def __dlpack_device__(self):
            return a.__dlpack_device__()

    arr, dt = as_input("x", Producer())
    assert dt == "FP16" and np.shares_memory(arr, a)
    with pytest.raises(InvalidArgument) as ei:
        as_input("img", _OnDevice())
    assert str(ei.value).startswith(
        "input 'img': numpy cannot take this DLPack tensor (device (2, 0))"
    )
    assert str(ei.value).endswith("only tensors in CPU memory are accepted")


def test_output_tensor():
    out = np.array([[b"x", "é".encode()]], dtype=object).view(Tensor)
    assert isinstance(out, np.ndarray)
    assert out.to_bytes_array().tolist() == [[b"x", "é".encode()]]
    assert out.to_string_array().tolist() == [["x", "é"]]
    num = np.arange(3, dtype=np.float32).view(Tensor)
    assert type(num * 2) is np.ndarray and type(num.sum()) is np.float32
    assert np.from_dlpack(num).tolist() == [0.0, 1.0, 2.0]
    assert num.to_host() is num


def test_errors_by_status():
    cases = {
        Status.INVALID_ARG: sluice.InvalidArgumentError,
        Status.NOT_FOUND: sluice.NotFoundError,
        Status.UNAVAILABLE: sluice.UnavailableError,
        Status.RESOURCE_EXHAUSTED: sluice.UnavailableError,
        Status.INTERNAL: sluice.InternalError,
        Status.UNSUPPORTED: sluice.UnsupportedError,
        Status.ALREADY_EXISTS: sluice.AlreadyExistsError,
        Status.CANCELLED: sluice.UnknownError,
    }
    for status, cls in cases.items():
        err = from_server_error(ServerError("words", status))
        assert type(err) is cls and err.status is status and str(err) == "words"
        assert isinstance(err, sluice.TritonError) and isinstance(err, ServerError)
    busy = from_server_error(Overloaded("full", Status.RESOURCE_EXHAUSTED, retry_after=3))
    assert isinstance(busy, sluice.UnavailableError) and busy.retry_after == 3
