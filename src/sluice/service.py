"""InferenceService: the one API both front-ends call (health, metadata, infer, repository
control, statistics). Front-ends only translate wire formats to these calls and map
``ServerError.status`` to their own codes.
"""

from __future__ import annotations

from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from .types import InferRequest, InferResponse

__all__ = ["InferenceService"]


class InferenceService:
    # --- health ---------------------------------------------------------------
    def live(self) -> bool:
        raise NotImplementedError

    def ready(self) -> bool:
        """Server readiness (strict or not, per --strict-readiness); False once shutting down."""
        raise NotImplementedError

    def server_metadata(self) -> dict[str, Any]:
        """{"name": ..., "version": ..., "extensions": [...]}"""
        raise NotImplementedError

    # --- models ---------------------------------------------------------------
    def model_ready(self, name: str, version: str = "") -> bool:
        """False for unknown / not ready; raises InvalidArgument for an illegal name or version."""
        raise NotImplementedError

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        """{"name", "versions": ["1"], "platform", "inputs": [{"name","datatype","shape"}], "outputs": [...]}
        shape includes -1 for the batch dimension when max_batch_size > 0."""
        raise NotImplementedError

    def model_config(self, name: str, version: str = "") -> mc.ModelConfig:
        raise NotImplementedError

    async def infer(self, request: InferRequest) -> InferResponse:
        raise NotImplementedError

    # --- repository -----------------------------------------------------------
    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """[{"name", "version", "state", "reason"}]; version/reason may be ""."""
        raise NotImplementedError

    async def load_model(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        """parameters: "config" -> JSON str; "file:<v>/<path>" -> raw bytes (HTTP front-end
        decodes base64 first)."""
        raise NotImplementedError

    async def unload_model(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        """parameters: "unload_dependents" -> bool."""
        raise NotImplementedError

    # --- statistics -----------------------------------------------------------
    def model_statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        """{"model_stats": [...]} in Triton's JSON shape (integers, ns durations)."""
        raise NotImplementedError
