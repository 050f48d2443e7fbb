"""uint8 HWC images -> top-1 ImageNet class and its softmax score, with resnet50 called
through BLS (any loaded model can be called; here the ONNX one)."""

import numpy as np
import triton_python_backend_utils as pb_utils

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(1, 3, 1, 1) * 255.0
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(1, 3, 1, 1) * 255.0


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            image = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy()
            chw = np.ascontiguousarray((image.transpose(0, 3, 1, 2) - MEAN) / STD, np.float32)
            call = pb_utils.InferenceRequest(
                model_name="resnet50",
                inputs=[pb_utils.Tensor("input", chw)],
                requested_output_names=["output"],
            )
            result = call.exec()
            if result.has_error():
                responses.append(pb_utils.InferenceResponse(error=result.error()))
                continue
            logits = pb_utils.get_output_tensor_by_name(result, "output").as_numpy()
            exp = np.exp(logits - logits.max(axis=1, keepdims=True))
            probs = exp / exp.sum(axis=1, keepdims=True)
            top = probs.argmax(axis=1)
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("CLASS", top.astype(np.int64).reshape(-1, 1)),
                        pb_utils.Tensor(
                            "SCORE", probs[np.arange(len(top)), top].reshape(-1, 1)
                        ),
                    ]
                )
            )
        return responses
