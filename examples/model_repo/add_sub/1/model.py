"""add_sub for Triton's python backend: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = model_config = __import__("json").loads(args["model_config"])
        out0 = pb_utils.get_output_config_by_name(model_config, "OUTPUT0")
        self.out_dtype = pb_utils.triton_string_to_numpy(out0["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUTPUT0", (a + b).astype(self.out_dtype)),
                        pb_utils.Tensor("OUTPUT1", (a - b).astype(self.out_dtype)),
                    ]
                )
            )
        return responses
