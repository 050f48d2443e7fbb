"""Which devices a model's instance groups ask for, against what this machine has.

Used by the load (a refused load) and by ``sluice repo lint`` (a finding), so both say the
same thing in the same words.
"""

from __future__ import annotations

import os

from tritonclient.grpc import model_config_pb2 as mc

from ..errors import InvalidArgument

__all__ = ["has_gpu", "check_devices"]


def has_gpu() -> bool:
    """An NVIDIA device node exists (the driver is loaded and a GPU is visible)."""
    return os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl")


def check_devices(name: str, config: mc.ModelConfig, gpu: bool | None = None) -> None:
    """Raise InvalidArgument when a group asks for KIND_GPU and there is no GPU (``gpu``:
    whether there is one; default: look at this machine)."""
    for group in config.instance_group:
        if group.kind != mc.ModelInstanceGroup.KIND_GPU:
            continue
        if gpu is None:
            gpu = has_gpu()
        if not gpu:
            raise InvalidArgument(
                f"failed to load '{name}': instance_group '{group.name}' asks for KIND_GPU but "
                "this machine has no GPU; use KIND_CPU (or KIND_AUTO)"
            )
