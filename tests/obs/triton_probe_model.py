"""``obs_probe``: a Triton Python-backend model for the observability end-to-end tests.

It does what ``spec_decode`` will do once the recorder is wired in, in a few
lines: route each request with the real governor, run the real loop on the
``draft`` and ``target`` models through BLS, and record everything with
:class:`~trtspec.obs.SpecMetrics` into Triton's custom metrics
(:class:`~trtspec.obs.TritonMetricSink`). The test copies this file into a model
repository as ``obs_probe/1/model.py``.

Input ``request`` (one JSON string): ``prompt_ids``, ``max_tokens``,
``priority``, ``speculation``, ``request_id``. Output ``result`` (one JSON
string): the route decision and the loop's per-request stats.
"""

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from trtspec.control import RequestInfo, SpeculationGovernor, load_policy
from trtspec.obs import SpecMetrics, TokenTimer, TritonMetricSink
from trtspec.serving.triton import model_parameters
from trtspec.serving.triton.bls import BLSLanguageModel
from trtspec.spec import GenerationRequest, SpeculativeDecoder, StopCriteria


class TritonPythonModel:
    def initialize(self, args):
        params = model_parameters(json.loads(args["model_config"]))
        vocab, ctx = int(params["vocab_size"]), int(params["max_context"])
        target = BLSLanguageModel(pb_utils, "target", vocab, ctx)
        draft = BLSLanguageModel(pb_utils, "draft", vocab, ctx)
        self.decoder = SpeculativeDecoder(target, draft)
        self.metrics = SpecMetrics(TritonMetricSink(pb_utils), model=args["model_name"])
        self.governor = SpeculationGovernor(load_policy(params["policy_file"]), breaker_listeners=[self.metrics])
        self.memory = {role: Path(params[f"{role}_weights"]).stat().st_size for role in ("draft", "target")}

    def execute(self, requests):
        responses = []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "request").as_numpy().reshape(-1)[0]
            r = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
            gen_request = GenerationRequest(
                tuple(r["prompt_ids"]), StopCriteria(max_new_tokens=r["max_tokens"]), request_id=r["request_id"]
            )
            timer = TokenTimer()
            info = RequestInfo.from_request(gen_request, priority=r["priority"], speculation=r["speculation"])
            with self.governor.decide(info) as control:
                self.metrics.request_started(control.speculate, control.reason)
                gen = self.decoder.stream(gen_request, self.metrics.wrap_policy(control, gen_request.request_id))
                for chunk in gen:
                    timer.tokens(len(chunk.token_ids))
                stats = gen.result.stats
                self.metrics.request_finished(
                    stats,
                    speculating=control.speculate,
                    ttft_s=timer.ttft_s,
                    itl_s=timer.itl_s,
                    latency_s=timer.elapsed_s(),
                    fallbacks=control.fallback.fallbacks,
                )
            self.metrics.set_gauges(
                self.governor.snapshot(),
                draft_memory_bytes=self.memory["draft"],
                target_memory_bytes=self.memory["target"],
            )
            result = {"speculate": control.speculate, "reason": control.reason, "stats": stats.to_dict()}
            out = pb_utils.Tensor("result", np.array([json.dumps(result).encode()], dtype=np.object_))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
