"""A target and (optionally) a draft, loaded and checked to fit together."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trtspec.runtime.compat import CompatReport, check_compatible
from trtspec.runtime.torch.loader import LoadedModel, Precision, load_model
from trtspec.decoding import SpeculativeDecoder


@dataclass
class ModelPair:
    target: LoadedModel
    draft: LoadedModel | None
    compat: CompatReport | None

    def decoder(self) -> SpeculativeDecoder:
        return SpeculativeDecoder(
            self.target.lm, self.draft.lm if self.draft else None, detokenizer=self.target.tokenizer
        )

    def describe(self) -> dict:
        def one(m: LoadedModel) -> dict:
            return {
                "path": str(m.path),
                "precision": m.precision,
                "impl": m.impl,
                "weight_bytes": m.weight_bytes,
                "load_time_s": round(m.load_time_s, 3),
                "exact": m.exact,
                "graphs": m.graphs.to_dict() if m.graphs else None,
            }

        return {
            "target": one(self.target),
            "draft": one(self.draft) if self.draft else None,
            "compat": self.compat.to_dict() if self.compat else None,
        }


def load_pair(
    target: str | Path,
    draft: str | Path | None,
    target_precision: Precision = "auto",
    draft_precision: Precision = "auto",
    device: str = "auto",
    max_context: int | None = None,
    progress: Callable[[str], None] | None = None,
    exact: bool | None = None,
) -> ModelPair:
    """Load both models and check that the draft can speculate for the target.

    ``exact`` applies to the target (its passes decide the output); the draft
    only proposes, so it runs unpadded (or in graph buckets on CUDA).
    """
    say = progress or (lambda _m: None)
    say(f"loading target {target}")
    t = load_model(target, target_precision, device, max_context=max_context, progress=progress, exact=exact)
    if draft is None:
        return ModelPair(target=t, draft=None, compat=None)
    say(f"loading draft {draft}")
    d = load_model(draft, draft_precision, device, max_context=max_context, progress=progress, exact=False)
    report = check_compatible(
        t.tokenizer, d.tokenizer, t.lm.vocab_size, d.lm.vocab_size, t.lm.max_context, d.lm.max_context
    )
    return ModelPair(target=t, draft=d, compat=report)
