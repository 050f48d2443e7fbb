"""uint8 HWC images -> ImageNet-normalised FP32 CHW, for resnet50 (a batch at a time)."""

import numpy as np
import triton_python_backend_utils as pb_utils

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(1, 3, 1, 1) * 255.0
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(1, 3, 1, 1) * 255.0


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            image = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy()
            chw = image.transpose(0, 3, 1, 2).astype(np.float32)
            out = np.ascontiguousarray((chw - MEAN) / STD, dtype=np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("PREPROCESSED", out)]))
        return responses
