"""Streams text_input back one word per response (optionally delay_ms apart), from a thread
per request so that execute() returns at once and requests overlap; stops early when the
client goes away."""

import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            delay = pb_utils.get_input_tensor_by_name(request, "delay_ms")
            delay_s = float(delay.as_numpy().reshape(-1)[0]) / 1000.0 if delay else 0.0
            words = text.reshape(-1)[0].decode("utf-8", "replace").split()
            sender = request.get_response_sender()
            threading.Thread(target=self._stream, args=(sender, words, delay_s)).start()
        return None

    def _stream(self, sender, words, delay_s):
        for word in words:
            if sender.is_cancelled():
                pb_utils.Logger.log_info("text_streamer: client went away; stopping")
                break
            out = pb_utils.Tensor("text_output", np.array([word.encode()], dtype=np.object_))
            sender.send(pb_utils.InferenceResponse([out]))
            if delay_s:
                time.sleep(delay_s)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
