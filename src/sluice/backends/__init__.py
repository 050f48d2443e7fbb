"""Model backends: python (worker processes), onnxruntime, torchscript, tensorrt, ensemble."""
