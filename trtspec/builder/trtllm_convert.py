"""HF checkpoint -> TensorRT-LLM checkpoint, as a subprocess of ``trtspec build --backend trtllm``.

``python -m trtspec.builder.trtllm_convert --model_dir HF --output_dir CKPT
--architecture LlamaForCausalLM --dtype bfloat16 [--use_weight_only
--weight_only_precision int8]``: the option names of TensorRT-LLM's
``convert_checkpoint.py`` example, without needing the examples tree. Runs
only where ``tensorrt_llm`` (1.0-1.2) is installed.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trtspec.builder.trtllm_convert")
    p.add_argument("--model_dir", required=True)
    p.add_argument("--output_dir", required=True)
    p.add_argument("--architecture", required=True)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--use_weight_only", action="store_true")
    p.add_argument("--weight_only_precision", choices=["int8"], default="int8")
    args = p.parse_args(argv)

    from tensorrt_llm.models import MODEL_MAP
    from tensorrt_llm.models.modeling_utils import QuantConfig
    from tensorrt_llm.quantization import QuantAlgo

    if args.architecture not in MODEL_MAP:
        print(f"TensorRT-LLM has no model class for {args.architecture}", file=sys.stderr)
        return 2
    quant = QuantConfig(quant_algo=QuantAlgo.W8A16) if args.use_weight_only else QuantConfig()
    model = MODEL_MAP[args.architecture].from_hugging_face(args.model_dir, dtype=args.dtype, quant_config=quant)
    model.save_checkpoint(args.output_dir, save_config=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
