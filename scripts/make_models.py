#!/usr/bin/env python3
"""Generate the example models that are not committed (seeded random weights, no download).

    python scripts/make_models.py [--repo examples/model_repo] [--force] [--only resnet50,...]

- ``resnet50/1/model.onnx``: ResNet-50 v1.5 built with ``onnx.helper`` (BatchNorm folded into
  the convolutions, as inference graphs are): "input" FP32 [N,3,224,224] -> "output"
  FP32 [N,1000]; the same shapes and FLOPs (~4.1 GMAC per image) as the real network.
- ``torch_linear/1/model.pt``: a small TorchScript MLP (INPUT__0 FP32 [16] -> OUTPUT__0
  FP32 [4]); skipped with a note when torch is not installed.
- ``ensemble_resnet50/1/``: the (empty) version directory of the ensemble
  preprocess -> resnet50.

Existing files are kept unless ``--force``. Weights are seeded: the same files every run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_REPO = ROOT / "examples" / "model_repo"


def build_resnet50(path: Path, seed: int = 0) -> None:
    """Write a seeded ResNet-50 ONNX graph (opset 17) to ``path``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    counter = [0]

    def fresh(prefix: str) -> str:
        counter[0] += 1
        return f"{prefix}_{counter[0]}"

    def conv(
        x: str, cin: int, cout: int, k: int, stride: int = 1, relu: bool = True, scale: float = 1.0
    ) -> str:
        name = fresh("conv")
        std = np.sqrt(2.0 / (cin * k * k)) * scale
        w = (rng.standard_normal((cout, cin, k, k), dtype=np.float32) * std).astype(np.float32)
        b = (rng.standard_normal(cout, dtype=np.float32) * 0.01).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"{name}.w"))
        inits.append(numpy_helper.from_array(b, f"{name}.b"))
        out = f"{name}.y"
        pad = k // 2
        nodes.append(
            helper.make_node(
                "Conv",
                [x, f"{name}.w", f"{name}.b"],
                [out],
                name=name,
                kernel_shape=[k, k],
                strides=[stride, stride],
                pads=[pad, pad, pad, pad],
            )
        )
        if relu:
            nodes.append(helper.make_node("Relu", [out], [f"{name}.r"], name=f"{name}_relu"))
            return f"{name}.r"
        return out

    def bottleneck(x: str, cin: int, width: int, stride: int) -> tuple[str, int]:
        cout = width * 4
        y = conv(x, cin, width, 1)
        y = conv(y, width, width, 3, stride)
        y = conv(y, width, cout, 1, relu=False, scale=0.2)  # keeps random activations finite
        short = conv(x, cin, cout, 1, stride, relu=False) if stride != 1 or cin != cout else x
        add = fresh("add")
        nodes.append(helper.make_node("Add", [y, short], [f"{add}.y"], name=add))
        nodes.append(helper.make_node("Relu", [f"{add}.y"], [f"{add}.r"], name=f"{add}_relu"))
        return f"{add}.r", cout

    x = conv("input", 3, 64, 7, 2)
    nodes.append(
        helper.make_node(
            "MaxPool",
            [x],
            ["pool1"],
            name="pool1",
            kernel_shape=[3, 3],
            strides=[2, 2],
            pads=[1, 1, 1, 1],
        )
    )
    x, cin = "pool1", 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            x, cin = bottleneck(x, cin, width, stride if i == 0 else 1)
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"], name="gap"))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"], name="flatten", axis=1))
    fc_w = (rng.standard_normal((1000, 2048), dtype=np.float32) * np.sqrt(1.0 / 2048)).astype(
        np.float32
    )
    inits.append(numpy_helper.from_array(fc_w, "fc.w"))
    inits.append(numpy_helper.from_array(np.zeros(1000, np.float32), "fc.b"))
    nodes.append(
        helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["output"], name="fc", transB=1)
    )
    graph = helper.make_graph(
        nodes,
        "resnet50",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 224, 224])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 1000])],
        initializer=inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="sluice-make-models"
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    onnx.save(model, str(tmp))
    tmp.replace(path)


def build_torch_linear(path: Path, seed: int = 0) -> bool:
    """Write a small TorchScript MLP; False (nothing written) when torch is missing."""
    try:
        import torch
    except ImportError:
        return False

    class Mlp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = torch.nn.Linear(16, 32)
            self.fc2 = torch.nn.Linear(32, 4)

        def forward(self, INPUT__0: torch.Tensor) -> torch.Tensor:  # noqa: N803
            return self.fc2(torch.relu(self.fc1(INPUT__0)))

    torch.manual_seed(seed)
    module = torch.jit.script(Mlp().eval())
    path.parent.mkdir(parents=True, exist_ok=True)
    module.save(str(path))
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, default=DEFAULT_REPO)
    ap.add_argument("--force", action="store_true", help="rebuild existing files")
    ap.add_argument("--only", default="", help="comma list: resnet50,torch_linear,ensemble")
    args = ap.parse_args(argv)
    only = {s for s in args.only.split(",") if s}
    repo: Path = args.repo

    def wanted(what: str, target: Path) -> bool:
        return (not only or what in only) and (args.force or not target.exists())

    onnx_path = repo / "resnet50" / "1" / "model.onnx"
    if wanted("resnet50", onnx_path):
        print(f"make_models: building {onnx_path}", flush=True)
        build_resnet50(onnx_path)
    torch_path = repo / "torch_linear" / "1" / "model.pt"
    if wanted("torch_linear", torch_path):
        if build_torch_linear(torch_path):
            print(f"make_models: built {torch_path}")
        else:
            print(
                "make_models: torch is not installed; skipping torch_linear "
                "(pip install sluice[torch])",
                file=sys.stderr,
            )
    ens = repo / "ensemble_resnet50" / "1"
    if (not only or "ensemble" in only) and (repo / "ensemble_resnet50").is_dir():
        ens.mkdir(parents=True, exist_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
