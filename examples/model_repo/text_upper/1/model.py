"""BYTES example: upper-cases each string and reports its length in bytes."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            upper = np.array([bytes(t).upper() for t in text.reshape(-1)], dtype=np.object_)
            lengths = np.array([len(t) for t in text.reshape(-1)], dtype=np.int32)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUTPUT0", upper.reshape(text.shape)),
                        pb_utils.Tensor("LENGTH", lengths.reshape(text.shape)),
                    ]
                )
            )
        return responses
