"""A lean Llama-family forward pass with a static, per-session KV cache.

Why not ``transformers`` for the hot path: on a few-core CPU its per-layer
overhead (dynamic cache objects, mask building, module hooks) costs as much as
the arithmetic for one token. Here a layer is eight tensor ops on weights laid
out ``[out, in]`` (what ``F.linear`` wants), Q/K/V and gate/up fused into one
matrix each, and the cache is preallocated and written in place.

Supports ``LlamaForCausalLM`` checkpoints (Llama 2/3, SmolLM, TinyLlama,
Mistral without sliding window) and ``Qwen2ForCausalLM`` (Q/K/V bias). Other
architectures go through :mod:`trtspec.runtime.torch.hf`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trtspec.errors import CheckpointError

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
PAD_POSITIONS = 64  # cache slots and RoPE rows past the context, for padding rows; the most rows a pass has
PACK_ROWS = 64  # the row count oneDNN lays packed CPU weights out for (any count runs; 1 or 6 do worse)
DEQUANT_ROWS = 16  # from this many rows on, a CPU with bf16 in hardware dequantizes int8 matrices (_int8_by_int8pack)


def lean_runs(cfg: Mapping) -> bool:
    """Whether the lean runtime runs a checkpoint with this ``config.json`` (else transformers does)."""
    return any(a in SUPPORTED_ARCHITECTURES for a in cfg.get("architectures") or [])


EMBEDDING = "model.embed_tokens.weight"
LM_HEAD = "lm_head.weight"
LAYERS = "model.layers."  # every decoder layer's tensors: model.layers.{i}.


def head_tied(tie_word_embeddings: bool, tensor_names: Container[str]) -> bool:
    """Whether the LM head is the embedding: the config says so, or the checkpoint holds no LM head."""
    return tie_word_embeddings or LM_HEAD not in tensor_names


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False
    rope_scaling: Mapping | None = None

    @classmethod
    def from_hf(cls, cfg: Mapping) -> LlamaConfig:
        archs = cfg.get("architectures") or []
        if not lean_runs(cfg):
            raise CheckpointError(f"lean runtime supports {SUPPORTED_ARCHITECTURES}, checkpoint is {archs}")
        if cfg.get("sliding_window") and cfg.get("use_sliding_window", "Mistral" in str(archs)):
            raise CheckpointError("sliding-window attention is not supported by the lean runtime")
        rope = cfg.get("rope_parameters") or {}
        scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        if scaling is not None and scaling.get("rope_type", scaling.get("type")) not in (None, "default", "llama3"):
            raise CheckpointError(f"rope scaling {scaling!r} is not supported by the lean runtime")
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        return cls(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", False)) or "Qwen2ForCausalLM" in archs,
            rope_scaling=scaling,
        )


@dataclass(frozen=True)
class Int8Weight:
    """Weight-only int8, per output channel, symmetric: ``w ~= q * scale[:, None]``."""

    q: torch.Tensor  # [out, in] int8
    scale: torch.Tensor  # [out], in the compute dtype

    @property
    def nbytes(self) -> int:
        return self.q.numel() + self.scale.numel() * self.scale.element_size()


INT4_GROUP = 32  # inputs per (scale, zero) pair: a GGUF Q4_1 block's size, the smallest torch's int4 kernels take
INT4_OUT_MULTIPLE = 16  # torch's CPU int4 packing takes matrices of a multiple of 16 outputs


@dataclass(frozen=True)
class Int4Weight:
    """Weight-only int4, asymmetric in groups of :data:`INT4_GROUP` inputs: ``w ~= (q - 8) * scale + zero``
    with ``q`` in 0..15, packed for torch's CPU kernel (``_weight_int4pack_mm_for_cpu``). A GGUF
    Q4_1 block (``d * q + m``) is this form with ``scale = d``, ``zero = m + 8 d``."""

    packed: torch.Tensor  # [out, in / 2] uint8, torch's CPU int4 layout
    scale_zeros: torch.Tensor  # [in / INT4_GROUP, out, 2] in the compute dtype: (scale, zero) per group

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + self.scale_zeros.numel() * self.scale_zeros.element_size()


Weight = torch.Tensor | Int8Weight | Int4Weight


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel symmetric int8: returns ``(q [out, in] int8, scale [out] float32)``.

    ``scale = max|w_row| / 127`` and ``q = round(w / scale)``, so the largest
    weight of each row maps to exactly +-127. Deterministic, and idempotent on
    weights that are already ``q * scale``.
    """
    assert w.dim() == 2, f"expected a [out, in] matrix, got {tuple(w.shape)}"
    wf = w.float()
    scale = wf.abs().amax(dim=1) / 127.0  # [out]
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(wf / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def quantize_int4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric int4 in groups of :data:`INT4_GROUP` inputs: returns ``(q [out, in] int32 in 0..15,
    scale [out, in / group], zero [out, in / group])``, float32, ``w ~= (q - 8) * scale + zero``.

    ``scale = (max - min) / 15`` and ``q = round((w - min) / scale)`` per group, so a group's least
    and largest weights map to exactly 0 and 15; weights already on such a grid (a Q4_1 GGUF's,
    dequantized) come back as the same ``q``, scale and zero.
    """
    assert w.dim() == 2 and w.shape[1] % INT4_GROUP == 0, f"expected [out, in], in a multiple of {INT4_GROUP}"
    out, inp = w.shape
    groups = w.float().reshape(out, inp // INT4_GROUP, INT4_GROUP)
    lo, hi = groups.amin(dim=-1), groups.amax(dim=-1)
    scale = (hi - lo) / 15.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round((groups - lo[..., None]) / scale[..., None]).clamp_(0, 15).to(torch.int32)
    return q.reshape(out, inp), scale, lo + 8.0 * scale


def check_int4_shape(name: str, shape: Sequence[int]) -> None:
    """Refuse, in one line, a matrix torch's CPU int4 kernel cannot take."""
    out, inp = shape
    if out % INT4_OUT_MULTIPLE or inp % INT4_GROUP:
        raise CheckpointError(f"int4 needs each layer matrix's outputs a multiple of {INT4_OUT_MULTIPLE} and its "
                              f"inputs a multiple of {INT4_GROUP}; {name} is [{out}, {inp}] (use int8)")


def int4_weight(w: torch.Tensor, name: str, dtype: torch.dtype) -> Int4Weight:
    """``w`` ``[out, in]`` (float) as an :class:`Int4Weight` for the CPU, scales and zeros in ``dtype``."""
    check_int4_shape(name, w.shape)
    return int4_from_codes(*quantize_int4(w), dtype)


def int4_unfit(cfg: LlamaConfig) -> str | None:
    """Why int4 would not serve this model well on this CPU (None: it would). torch's CPU int4 kernel
    is vectorized for AVX2 and AVX-512 only; elsewhere (ATen's ``DEFAULT`` kernels) it is scalar and
    slower than int8: the demo draft's step 426 ms at int4, 70 ms at int8, the fp32 target's 35
    (``ATEN_CPU_CAPABILITY=default`` on a Zen 4). And the kernel takes only some shapes
    (:func:`check_int4_shape`)."""
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in ("AVX2", "AVX512"):
        return f"this CPU's torch kernels are {capability}: int4 runs there slower than int8"
    h, q, kv, inter = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size
    shapes = {"q_proj": (q, h), "k_proj": (kv, h), "o_proj": (h, q), "gate_proj": (inter, h), "down_proj": (h, inter)}
    for name, shape in shapes.items():
        try:
            check_int4_shape(name, shape)
        except CheckpointError as e:
            return str(e)
    return None


def int4_from_codes(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, dtype: torch.dtype) -> Int4Weight:
    """:func:`quantize_int4`'s ``(q, scale, zero)`` packed for torch's CPU kernel, scales and zeros in ``dtype``."""
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
    return Int4Weight(packed=packed, scale_zeros=torch.stack([scale.t(), zero.t()], dim=-1).to(dtype).contiguous())


# A stored int4 matrix (an int4 checkpoint, ``trtspec build --draft-quant int4``): ``name`` uint8
# [out, in / 2], two codes a byte, the even input's in the low nibble; ``name_scale`` and ``name_zero``
# [out, in / INT4_GROUP] in bfloat16, as the runtime holds them. A stored int8 matrix: ``name`` int8
# [out, in] and ``name_scale`` [out].
SCALE_SUFFIX, ZERO_SUFFIX = "_scale", "_zero"
STORED_FORMS = {torch.int8: "int8", torch.uint8: "int4"}  # a stored matrix's form, by its dtype


def pack_int4_codes(q: torch.Tensor) -> torch.Tensor:
    """Codes ``q`` [out, in] in 0..15 as uint8 [out, in / 2] (the stored form above)."""
    pairs = q.to(torch.uint8).reshape(q.shape[0], -1, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).contiguous()


def unpack_int4_codes(packed: torch.Tensor) -> torch.Tensor:
    """:func:`pack_int4_codes` undone: int32 [out, in]."""
    return torch.stack([packed & 15, packed >> 4], dim=-1).reshape(packed.shape[0], -1).to(torch.int32)


def dequantize_int4(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """``(q - 8) * scale + zero`` per group of :data:`INT4_GROUP` inputs, float32 [out, in]."""
    out = q.shape[0]
    groups = (q.float() - 8.0).reshape(out, -1, INT4_GROUP) * scale.float()[..., None] + zero.float()[..., None]
    return groups.reshape(out, -1)


def stored_float(tensors: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
    """Tensor ``name`` as stored, dequantized where the checkpoint holds it as int8 or int4 (above)."""
    t = _stored(tensors, name)
    if t.dtype == torch.int8:
        return t.float() * _stored(tensors, name + SCALE_SUFFIX).float()[:, None]
    if t.dtype == torch.uint8:
        scale, zero = _stored(tensors, name + SCALE_SUFFIX), _stored(tensors, name + ZERO_SUFFIX)
        return dequantize_int4(unpack_int4_codes(t), scale, zero)
    return t


def is_side_tensor(tensors: Mapping[str, torch.Tensor], name: str) -> bool:
    """Whether ``name`` is a stored int8 / int4 matrix's scale or zero (read with its matrix)."""
    for sfx in (SCALE_SUFFIX, ZERO_SUFFIX):
        base = tensors.get(name[: -len(sfx)]) if name.endswith(sfx) else None
        if base is not None and base.dtype in STORED_FORMS:
            return True
    return False


def _stored(tensors: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
    t = tensors.get(name)
    if t is None:
        raise CheckpointError(f"checkpoint lacks tensor {name!r}")
    return t


def cpu_packing() -> bool:
    """Whether float32 matrices on the CPU run as oneDNN-packed weights (:func:`pack_cpu`)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def onednn_bf16() -> bool:
    """Whether oneDNN runs bfloat16 matmuls on this CPU (natively or emulated; it refuses to where it
    is held below AVX-512, ``ONEDNN_MAX_CPU_ISA``)."""
    probe = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(cpu_packing() and probe is not None and probe())


def packs(dtype: torch.dtype, device_type: str) -> bool:
    """Whether a model's float matrices in ``dtype`` are packed for oneDNN (:func:`pack_cpu`) there:
    float32 on the CPU; bfloat16 too where the CPU multiplies it in hardware and oneDNN runs it (the
    demo target in bf16 on a 2-core Zen 4 EPYC: 1 row 26.4 -> 21.3 ms, 8 rows 31.9 -> 24.6 ms, an
    exact-mode pass 41.9 -> 26.9 ms; docs/runtime.md). Elsewhere oneDNN would emulate bf16."""
    if device_type != "cpu" or not cpu_packing():
        return False
    return dtype == torch.float32 or (dtype == torch.bfloat16 and _CPU_BF16 and onednn_bf16())


def pack_cpu(w: torch.Tensor) -> torch.Tensor:
    """A float32 (or bf16, :func:`packs`) ``[out, in]`` matrix laid out for oneDNN's matmul (an
    opaque ``torch._mkldnn`` tensor).

    On a few-core CPU, ``F.linear`` (MKL) costs about as much per row as for one
    row: 2 rows 1.5x and 6 rows 2.2x of a 1-row pass of the 135M target on an
    AVX2 EPYC, so verifying k drafts cost almost k steps. oneDNN on the packed
    matrix is faster at every row count (1 row: the LM head 6.4 vs 11.9 ms; 6 rows:
    9.3 vs 40 ms). A row's product does not depend on the other rows or their
    number, bit for bit, for matrices of up to 576 inputs; with 1,536 or more
    (SmolLM2's down projection) in float32 it does, in the last bits, as does
    attention: exact mode is what pads that away.
    """
    return torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS)


def cpu_bf16_matmul() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AVX512-BF16; CPUs with AMX have it too)."""
    probe = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    return bool(probe is not None and probe())


_CPU_BF16 = cpu_bf16_matmul()
_int8pack_mm = torch.ops.aten._weight_int8pack_mm
_int4pack_mm = torch.ops.aten._weight_int4pack_mm_for_cpu


def _int8_by_int8pack(x: torch.Tensor) -> bool:
    """Whether an int8 matrix times ``x`` runs through ``_weight_int8pack_mm`` (else: dequantized).

    On a CPU that kernel costs about as much per row as for one row, so a long
    pass (a prompt) reads slower on the int8 draft than on the float32 target.
    With bfloat16 in hardware, dequantizing the matrix into a bf16 matmul wins
    from :data:`DEQUANT_ROWS` rows on (the demo draft on a 2-core Zen 4 EPYC,
    ``scripts/bench_prompt_read.py``: 64 rows 117 -> 68 ms, 1000 rows 2.1 -> 1.3 s;
    at 8-12 rows it ties or loses). Other CPUs keep the int8 kernel: with oneDNN
    held to AVX2 there, the bf16 matmul was 2-4x slower than it.
    """
    if x.device.type != "cpu":
        return False
    return not (_CPU_BF16 and x.dtype == torch.bfloat16 and x.shape[0] >= DEQUANT_ROWS)


def _linear(x: torch.Tensor, w: Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    if isinstance(w, torch.Tensor) and w.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x, w, bias, "none", [], "")
    if isinstance(w, Int4Weight):
        y = _int4pack_mm(x, w.packed, INT4_GROUP, w.scale_zeros)
        return y + bias if bias is not None else y
    if isinstance(w, Int8Weight):
        if _int8_by_int8pack(x):
            y = _int8pack_mm(x, w.q, w.scale)
        else:  # dequantize in the matmul's input (gpt-fast's weight-only int8; on CUDA inductor fuses it)
            y = F.linear(x, w.q.to(x.dtype)) * w.scale
        return y + bias if bias is not None else y
    return F.linear(x, w, bias)


def _nbytes(w: Weight) -> int:
    return w.nbytes if isinstance(w, (Int8Weight, Int4Weight)) else w.numel() * w.element_size()


@dataclass
class _Layer:
    attn_norm: torch.Tensor  # [hidden]
    w_qkv: Weight  # [(heads + 2 * kv_heads) * head_dim, hidden]
    b_qkv: torch.Tensor | None  # [(heads + 2 * kv_heads) * head_dim]
    w_o: Weight  # [hidden, heads * head_dim]
    mlp_norm: torch.Tensor  # [hidden]
    w_gate_up: Weight  # [2 * intermediate, hidden]
    w_down: Weight  # [hidden, intermediate]


def _check_quant(quant: str | None, dtype: torch.dtype, device: torch.device) -> None:
    if quant not in (None, "int8", "int4"):
        raise CheckpointError(f"weight quantization must be int8 or int4, got {quant!r}")
    if quant is not None and dtype != torch.bfloat16:
        raise CheckpointError(f"{quant} weight-only compute runs with bfloat16 activations")
    if quant == "int4" and device.type != "cpu":
        raise CheckpointError(f"int4 weight-only runs on the CPU (torch's int4 CPU kernel); on {device.type} use int8")


def _rope_inv_freq(cfg: LlamaConfig) -> torch.Tensor:
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    s = cfg.rope_scaling
    if s is not None and s.get("rope_type", s.get("type")) == "llama3":
        # Llama 3.1 frequency-dependent scaling.
        factor = s["factor"]
        low, high = s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0)
        old_ctx = s.get("original_max_position_embeddings", 8192)
        low_wl, high_wl = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_ctx / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > low_wl, inv_freq / factor, inv_freq)
        mid = (wavelen <= low_wl) & (wavelen >= high_wl)
        inv_freq = torch.where(mid, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)
    return inv_freq


class LlamaWeights:
    """The whole model's weights in the layout the forward pass wants.

    ``tensors`` maps HF parameter names to float tensors; a matrix may instead
    come pre-quantized (int8, or int4: :func:`stored_float`'s forms).
    With ``quant="int8"`` every matrix (embedding and LM head included) runs as
    weight-only int8 with activations in ``dtype`` (bfloat16); float matrices are
    quantized on load with :func:`quantize_int8`. With ``quant="int4"`` (CPU
    only) the layers' matrices run as weight-only int4 (:func:`quantize_int4`,
    from the float weights), the embedding and LM head as int8 (as a Q4_1
    GGUF keeps its embedding in Q8_0). In float32 on the CPU (and
    bf16, :func:`packs`) the matrices are packed for oneDNN
    (:func:`pack_cpu`); the embedding stays a plain matrix for the lookup, so
    a tied LM head is held twice. ``pack=False`` keeps every matrix plain
    (compiled layers, :meth:`LayerOps.compiled`, cannot read packed ones).
    """

    def __init__(
        self,
        cfg: LlamaConfig,
        tensors: Mapping[str, torch.Tensor],
        dtype: torch.dtype,
        device: str,
        quant: str | None = None,
        pack: bool = True,
    ):
        self.cfg = cfg
        self.dtype = dtype
        self.device = torch.device(device)
        _check_quant(quant, dtype, self.device)
        r = _Reader(tensors, dtype, self.device, quant, pack)
        self.packed = r.pack
        self.embed = r.dense(EMBEDDING)  # [vocab, hidden]
        self.layers = [r.layer(f"{LAYERS}{i}.") for i in range(cfg.num_layers)]
        self.norm = r.vec("model.norm.weight")
        self.tied = head_tied(cfg.tie_word_embeddings, tensors)
        self.lm_head = r.packed(self.embed if self.tied else r.dense(LM_HEAD))  # [vocab, hidden]
        inv_freq = _rope_inv_freq(cfg)
        # PAD_POSITIONS more rows: padding rows of a static-shape pass continue past the last real position.
        pos = torch.arange(cfg.max_position_embeddings + PAD_POSITIONS, dtype=torch.float64)
        freqs = torch.outer(pos, inv_freq)  # [max_pos, head_dim / 2]
        emb = torch.cat([freqs, freqs], dim=-1)  # [max_pos, head_dim]
        # RoPE tables in the compute dtype, as HF casts them.
        self.cos = emb.cos().to(device=self.device, dtype=dtype)
        self.sin = emb.sin().to(device=self.device, dtype=dtype)

    def nbytes(self) -> int:
        """Bytes of weights held (a tied LM head once, or twice where the matrices are packed)."""
        weights: list[Weight] = [self.embed, self.norm]
        if self.lm_head is not self.embed:
            weights.append(self.lm_head)
        for layer in self.layers:
            weights += [t for t in vars(layer).values() if t is not None]
        return sum(_nbytes(w) for w in weights)


class _Reader:
    """Checkpoint tensors into :class:`LlamaWeights`' layout (see its docstring for ``quant`` and ``pack``)."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], dtype: torch.dtype, device: torch.device,
                 quant: str | None, pack: bool) -> None:
        self.tensors, self.dtype, self.device, self.quant = tensors, dtype, device, quant
        self.int8 = quant is not None  # int4: the embedding and LM head int8
        self.pack = pack and not self.int8 and packs(dtype, device.type)

    def raw(self, name: str) -> torch.Tensor:
        return _stored(self.tensors, name)

    def vec(self, name: str) -> torch.Tensor:
        return self.raw(name).to(device=self.device, dtype=self.dtype).contiguous()

    def maybe_vec(self, name: str) -> torch.Tensor | None:
        return self.vec(name) if name in self.tensors else None

    def packed(self, w: Weight) -> Weight:
        return pack_cpu(w) if self.pack and isinstance(w, torch.Tensor) else w

    def layer(self, p: str) -> _Layer:
        """Decoder layer ``p`` (``model.layers.{i}.``)."""
        biases = [self.maybe_vec(p + f"self_attn.{n}_proj.bias") for n in "qkv"]
        return _Layer(
            attn_norm=self.vec(p + "input_layernorm.weight"),
            w_qkv=self.mat(*(p + f"self_attn.{n}_proj.weight" for n in "qkv")),
            b_qkv=torch.cat(biases).contiguous() if all(b is not None for b in biases) else None,
            w_o=self.mat(p + "self_attn.o_proj.weight"),
            mlp_norm=self.vec(p + "post_attention_layernorm.weight"),
            w_gate_up=self.mat(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
            w_down=self.mat(p + "mlp.down_proj.weight"),
        )

    def mat(self, *names: str) -> Weight:
        """A layer's matrix: ``names`` stacked (fused q/k/v, gate/up)."""
        if self.quant != "int4":
            return self.packed(self.dense(*names))
        if all(self.raw(n).dtype == torch.uint8 for n in names):  # stored int4: its codes as they are
            codes = [(unpack_int4_codes(self.raw(n)), self.raw(n + SCALE_SUFFIX), self.raw(n + ZERO_SUFFIX))
                     for n in names]
            q, scale, zero = (torch.cat(parts) for parts in zip(*codes, strict=True))
            check_int4_shape(names[0], q.shape)
            return int4_from_codes(q, scale, zero, self.dtype)
        return int4_weight(torch.cat([self.as_float(n) for n in names]), names[0], self.dtype)

    def as_float(self, name: str) -> torch.Tensor:
        """Tensor ``name`` as stored, or dequantized where the checkpoint holds it as int8 or int4."""
        return stored_float(self.tensors, name)

    def dense(self, *names: str) -> Weight:
        """``names`` stacked, plain: int8 (pre-quantized, or quantized here) where ``quant`` is set; else in
        the compute dtype (a pre-quantized checkpoint dequantized)."""
        if not self.int8:
            return torch.cat([self.as_float(n) for n in names]).to(device=self.device, dtype=self.dtype).contiguous()
        parts = []
        for name in names:
            t = self.raw(name)
            parts.append((t, self.raw(name + SCALE_SUFFIX).float()) if t.dtype == torch.int8
                         else quantize_int8(self.as_float(name)))
        q = torch.cat([t for t, _ in parts]).to(self.device).contiguous()
        scale = torch.cat([sc for _, sc in parts]).to(self.device, self.dtype)
        return Int8Weight(q=q, scale=scale)


def _embed(ids: torch.Tensor, w: Weight) -> torch.Tensor:
    if isinstance(w, Int8Weight):
        return F.embedding(ids, w.q).to(w.scale.dtype) * w.scale[ids][:, None]
    return F.embedding(ids, w)


def _rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    # As HF Llama: normalise in float32, scale in the compute dtype.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class KVCache:
    """Keys and values of one sequence: ``[layers, kv_heads, capacity, head_dim]`` each.

    Zero-filled, and every slot ever written holds finite values, so keys that
    the mask hides contribute exactly nothing (a hidden NaN would poison the
    softmax).
    """

    def __init__(self, cfg: LlamaConfig, dtype: torch.dtype, device: torch.device, capacity: int):
        shape = (cfg.num_layers, cfg.num_kv_heads, capacity, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def reserve(self, needed: int, limit: int) -> None:
        """Grow (doubling, up to ``limit``) so that ``needed`` slots fit."""
        if needed <= self.capacity:
            return
        new_cap = min(limit, max(needed, 2 * self.capacity))
        shape = (*self.k.shape[:2], new_cap, self.k.shape[3])
        k = self.k.new_zeros(shape)
        v = self.v.new_zeros(shape)
        k[:, :, : self.length] = self.k[:, :, : self.length]
        v[:, :, : self.length] = self.v[:, :, : self.length]
        self.k, self.v = k, v

    def copy_prefix_from(self, other: KVCache) -> None:
        """Hold ``other``'s first ``other.length`` tokens (this cache must be large enough)."""
        n = other.length
        self.k[:, :, :n] = other.k[:, :, :n]
        self.v[:, :, :n] = other.v[:, :, :n]
        self.length = n

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


def kv_dtype(compute: torch.dtype, device_type: str) -> torch.dtype:
    """The dtype a model's KV cache holds: float32 on the CPU, where torch's attention over a
    bfloat16 cache costs 3-7x as much per key for one row as over a float32 one (a 135M draft's
    step at 1,024 cached tokens: 32.7 -> 18.9 ms; docs/runtime.md); the compute dtype elsewhere."""
    return torch.float32 if device_type == "cpu" else compute


def causal_mask(pos: torch.Tensor, window: int) -> torch.Tensor:
    """``[rows, window]`` bool: row ``i`` sees key ``j`` iff ``j <= pos[i]``."""
    return torch.arange(window, device=pos.device)[None, :] <= pos[:, None]


def _qkv(
    x: torch.Tensor, layer: _Layer, cos: torch.Tensor, sin: torch.Tensor, cfg: LlamaConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """First half of a layer: norm, fused Q/K/V projection, RoPE. ``q [nh, R, hd]``, ``k, v [nkv, R, hd]``."""
    n, nh, nkv, hd = x.shape[0], cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    h = _rms_norm(x, layer.attn_norm, cfg.rms_norm_eps)
    qkv = _linear(h, layer.w_qkv, layer.b_qkv)  # [R, (nh + 2 nkv) hd]
    qk, v = qkv.split([(nh + nkv) * hd, nkv * hd], dim=-1)
    qk = qk.view(n, nh + nkv, hd).transpose(0, 1)
    qk = qk * cos + _rotate_half(qk) * sin  # RoPE on the query and key heads at once: half the ops
    q, k = qk.split([nh, nkv])
    return q, k, v.view(n, nkv, hd).transpose(0, 1)


def _attend_mlp(
    x: torch.Tensor,
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor | None,
    layer: _Layer,
    cfg: LlamaConfig,
) -> torch.Tensor:
    """Second half of a layer: attention over the cached ``keys``/``values`` ``[nkv, W, hd]``, then the MLP."""
    n, nh, nkv, hd = x.shape[0], cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    attn = F.scaled_dot_product_attention(
        q.unsqueeze(0).to(keys.dtype), keys.unsqueeze(0), values.unsqueeze(0), attn_mask=mask, enable_gqa=nh != nkv
    ).to(x.dtype)  # [1, nh, R, hd], in the cache's dtype (kv_dtype), back to the compute dtype
    x = x + _linear(attn[0].transpose(0, 1).reshape(n, nh * hd), layer.w_o)
    h = _rms_norm(x, layer.mlp_norm, cfg.rms_norm_eps)
    gate, up = _linear(h, layer.w_gate_up).chunk(2, dim=-1)
    return x + _linear(F.silu(gate) * up, layer.w_down)


def _head(x: torch.Tensor, norm: torch.Tensor, lm_head: Weight, eps: float) -> torch.Tensor:
    return _linear(_rms_norm(x, norm, eps), lm_head).float()


def layer_of(qkv: Callable, attend_mlp: Callable) -> Callable:
    """A whole layer from its two halves, with the KV write between them."""

    def run_layer(x: torch.Tensor, layer: _Layer, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor,
                  values: torch.Tensor, pos: torch.Tensor, window: int, mask: torch.Tensor | None,
                  cfg: LlamaConfig) -> torch.Tensor:
        """Write the K/V of rows ``pos`` into this layer's ``keys``/``values`` ``[nkv, capacity, hd]``
        (in place), attend over slots ``0..window-1``."""
        q, k, v = qkv(x, layer, cos, sin, cfg)
        keys.index_copy_(1, pos, k.to(keys.dtype))
        values.index_copy_(1, pos, v.to(values.dtype))
        return attend_mlp(x, q, keys[:, :window], values[:, :window], mask, layer, cfg)

    return run_layer


@dataclass(frozen=True)
class LayerOps:
    """The pieces :func:`forward` runs: eager functions, or the same ones through ``torch.compile``.

    Compiled, a layer is one piece with its KV write inside (``scope="layer"``:
    inductor fuses the write into the RoPE kernel and writes the cache in place)
    or, for comparison, two pure pieces with the write between them
    (``"pieces"``). Either way a piece takes the layer's tensors as arguments,
    so one compilation per shape serves every layer, and it captures into a
    CUDA graph as is.
    """

    layer: Callable = layer_of(_qkv, _attend_mlp)
    head: Callable = _head

    @classmethod
    def compiled(cls, scope: str = "layer") -> LayerOps:
        if scope not in ("layer", "pieces"):
            raise ValueError(f"compile scope {scope!r}: choose layer or pieces")
        # One compilation per (rows, window) and model shape: more than dynamo's default 8 per function.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)

        def c(fn: Callable) -> Callable:
            return torch.compile(fn, fullgraph=True, dynamic=False)

        layer = c(cls.layer) if scope == "layer" else layer_of(c(_qkv), c(_attend_mlp))
        return cls(layer=layer, head=c(_head))


EAGER = LayerOps()


def forward(
    w: LlamaWeights,
    cache: KVCache,
    ids: torch.Tensor,
    pos: torch.Tensor,
    window: int,
    mask: torch.Tensor | None,
    first_logit: int | None,
    ops: LayerOps = EAGER,
) -> torch.Tensor | None:
    """One pass: write the K/V of ``ids [R]`` at positions ``pos [R]``, attend over cache slots ``0..window-1``.

    ``mask [R, window]`` (:func:`causal_mask`) hides keys after each row's own
    position (``None``: every key visible, a single row at the cache's end).
    Returns what ``ops.head`` makes of rows ``first_logit:`` (float32 logits
    ``[R - first_logit, vocab]``; argmax ids with an :class:`~trtspec.runtime.torch.argmax.ArgmaxHead`'s),
    or ``None`` when ``first_logit`` is ``None``. A row's
    result depends only on its token, its position and the cached keys it sees,
    not on the other rows; with ``R`` and ``window`` fixed the arithmetic is
    fixed too (what exact mode relies on). Does not move ``cache.length``.
    """
    cfg = w.cfg
    assert ids.dim() == 1 and pos.shape == ids.shape and int(ids.shape[0]) > 0
    assert window <= cache.capacity, f"window {window} exceeds the cache's {cache.capacity} slots"
    x = _embed(ids, w.embed)  # [R, hidden]
    cos = w.cos[pos]  # [R, head_dim]
    sin = w.sin[pos]
    for li, layer in enumerate(w.layers):
        x = ops.layer(x, layer, cos, sin, cache.k[li], cache.v[li], pos, window, mask, cfg)
    if first_logit is None:
        return None
    return ops.head(x[first_logit:], w.norm, w.lm_head, cfg.rms_norm_eps)
