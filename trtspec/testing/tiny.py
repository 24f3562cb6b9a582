"""Tiny randomly initialised Llama checkpoints with a real (small) tokenizer.

Seconds to make, megabytes on disk; used by the tests of every layer (the loop,
the runtimes, the build, the served models) where the demo pair would be slow.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

CORPUS = (
    "The quick brown fox jumps over the lazy dog. Speculative decoding drafts tokens with a small model "
    "and verifies them with a large one in a single forward pass. Triton Inference Server serves models "
    "over HTTP and gRPC. Numbers 0 1 2 3 4 5 6 7 8 9 10 42 100. def f(x): return x * 2\n"
    "Hello world! How are you today? I am fine, thank you. The cat sat on the mat.\n"
)

# A policy for served tests of the tiny pair: speculation stays on at a fixed k whatever the draft does.
# With the defaults the tiny pair would rightly stop speculating: goodput learns that a BLS round trip
# costs more than their forward pass, and their ~35% rejection opens the breaker. (The control plane's
# own tests cover those decisions.)
STATIC_POLICY = """
draft_length:
  controller: static
  static: {k: 5}
breaker: {enabled: false}
fallback: {enabled: false}
"""

# A ChatML template for the tiny tokenizer (it has none): what the OpenAI chat path needs.
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def with_chat_template(checkpoint: Path, out_dir: Path) -> Path:
    """A copy of ``checkpoint``'s tokenizer in ``out_dir`` that has :data:`CHATML` as its chat template."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(checkpoint))
    tok.chat_template = CHATML
    tok.save_pretrained(str(out_dir))
    return out_dir


def make_tokenizer(out_dir: Path, vocab_size: int = 384):
    """A byte-level BPE tokenizer trained on a fixed corpus (deterministic)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([CORPUS] * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(str(out_dir))
    return fast


def tiny_config(vocab_size: int, **overrides) -> dict:
    cfg = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        initializer_range=0.25,
        bos_token_id=1,
        eos_token_id=2,
    )
    cfg.update(overrides)
    return cfg


def make_tiny_llama(
    out_dir: str | Path,
    seed: int = 0,
    base: str | Path | None = None,
    noise: float = 0.0,
    **config_overrides,
) -> Path:
    """Save a tiny Llama (HF format, safetensors + tokenizer) to ``out_dir``.

    ``base`` + ``noise``: copy ``base``'s weights and add Gaussian noise of that
    relative size (a draft that mostly agrees with ``base``). Without ``base``:
    fresh random weights from ``seed`` (a draft that mostly disagrees).
    """
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(out)
    vocab = len(tok)
    if base is not None:
        cfg_dict = json.loads((Path(base) / "config.json").read_text())
        config = LlamaConfig.from_dict(cfg_dict)
    else:
        config = LlamaConfig(**tiny_config(**{"vocab_size": vocab, **config_overrides}))
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    if base is not None:
        src = LlamaForCausalLM.from_pretrained(str(base), dtype=torch.float32)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for (name, p), (_, q) in zip(model.named_parameters(), src.named_parameters()):
                p.copy_(q + noise * q.std() * torch.randn(q.shape, generator=gen))
    else:
        with torch.no_grad():  # HF's init leaves norms at 1 and small weights; widen the logits a little
            for name, p in model.named_parameters():
                if p.dim() == 2:
                    p.normal_(0.0, config.initializer_range)
    model.save_pretrained(str(out))
    return out


PAIRS = ("tiny", "tiny-long", "demo")

# Prompts whose greedy answer from the tiny target (``make_tiny_llama(seed=0)``, as the tests' ``tiny_target``)
# ends at EOS within 16 tokens on the machines measured (fp32 and bf16). Tests that need an answer cut short by
# EOS take the first that is, at run time, and assert that one was.
EOS_PROMPTS = ("end numbers", "one fox numbers", "the hello the cat")


def pair_paths(pair: str, work: Path) -> tuple[Path, Path]:
    """(target, draft) checkpoints of a named pair for scripts: ``demo`` (the cached demo pair,
    prepared on first use), ``tiny`` (made under ``work``: a draft that is the target plus 1% noise)
    or ``tiny-long`` (holding 4,096 tokens instead of 256, with 6 layers instead of 2: a ~3,300-token
    prompt takes 1-3 s to prefill on 2 cores; with 2 layers a fast AVX-512 core took 0.4 s)."""
    if pair == "demo":
        import sys

        from trtspec.runtime.demo import prepare_demo

        p = prepare_demo(lambda m: print(f"[demo] {m}", file=sys.stderr))
        return p.target, p.draft
    if pair not in PAIRS:
        raise ValueError(f"unknown pair {pair!r}; choose one of {', '.join(PAIRS)}")
    overrides = {"max_position_embeddings": 4096, "num_hidden_layers": 6} if pair == "tiny-long" else {}
    target = make_tiny_llama(work / pair / "target", seed=0, **overrides)
    return target, make_tiny_llama(work / pair / "draft", seed=1, base=target, noise=0.01)
