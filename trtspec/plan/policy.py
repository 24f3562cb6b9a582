"""The recommended policy: routing threshold, draft-length controller, rollout stages.

Rules (``docs/bench_plan.md``):

- Threshold: walking the length buckets from the longest down, the lowest
  bucket such that it and every longer one pays (expected speedup at the
  logged load >= 1 + ``min_gain``); speculate when the context is longer
  than that bucket's lower edge. If the longest bucket does not pay, nothing
  speculates (rollout ``off``).
- Routing: ``context_tokens_gt: T -> speculate (long_context)``, default
  ``target_only`` (``short_context``); with ``T = 0`` no rule and the default
  ``speculate``. (The default policy's ``high_priority -> target_only`` rule
  is left out: below the threshold nothing speculates anyway, and above it
  speculation pays for every priority.)
- Draft length: ``k*`` = the k in 1..``k_max`` that maximises Leviathan's
  speedup at the measured alpha and c. ``static`` at ``k*`` when the measured
  per-bucket alphas lie within 0.1 of each other (one alpha fits all);
  ``goodput`` otherwise (it adapts per request).
- Rollout: ``offline_only`` -> ``canary`` (5%) -> ``full``; one policy file per
  stage, each validated by :func:`trtspec.control.parse_policy`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trtspec.control.config import Policy, dump_policy, parse_policy

ALPHA_SPREAD_STATIC = 0.1
CANARY_FRACTION = 0.05
STAGES = ("offline_only", "canary", "full")
STAGE_FILES = {"offline_only": "policy.yaml", "canary": "policy.canary.yaml", "full": "policy.full.yaml"}
OFF_FILE = "policy.yaml"
K_MAX = 8


@dataclass(frozen=True)
class Recommendation:
    threshold: int | None  # speculate when context_tokens > threshold; None: nothing pays
    k: int
    controller: str  # static | goodput
    k_max: int
    stages: dict[str, Policy]  # rollout stage -> policy (just {"off": ...} when nothing pays)

    def to_dict(self) -> dict:
        return {
            "threshold": self.threshold,
            "k": self.k,
            "controller": self.controller,
            "k_max": self.k_max,
            "rollout": list(self.stages),
        }


def recommended_threshold(buckets: list[tuple[int, bool]]) -> int | None:
    """``buckets``: (lower edge, pays) in ascending order. The lowest edge from which every bucket pays."""
    threshold: int | None = None
    for lo, pays in reversed(buckets):
        if not pays:
            break
        threshold = lo
    return threshold


def choose_controller(alpha_by_bucket: dict[str, float]) -> str:
    values = list(alpha_by_bucket.values())
    if len(values) >= 2 and max(values) - min(values) > ALPHA_SPREAD_STATIC:
        return "goodput"
    return "static"


def policy_document(threshold: int | None, k: int, controller: str, mode: str) -> dict:
    """The policy file's content (only what differs from the defaults, plus what the plan decided)."""
    k_max = max(K_MAX, k)
    if threshold is None:
        routing = {"rules": [], "default_action": "target_only", "default_reason": "speculation_does_not_pay"}
    elif threshold == 0:
        routing = {"rules": [], "default_action": "speculate", "default_reason": "default"}
    else:
        routing = {
            "rules": [{"when": {"context_tokens_gt": threshold}, "action": "speculate", "reason": "long_context"}],
            "default_action": "target_only",
            "default_reason": "short_context",
        }
    draft_length: dict = {"controller": controller, "k_max": k_max}
    if controller == "static":
        draft_length["static"] = {"k": k}
    rollout: dict = {"mode": mode}
    if mode == "canary":
        rollout["canary_fraction"] = CANARY_FRACTION
    return {"version": 1, "rollout": rollout, "routing": routing, "draft_length": draft_length}


def recommend(threshold: int | None, k: int, alpha_by_bucket: dict[str, float]) -> Recommendation:
    controller = choose_controller(alpha_by_bucket)
    if threshold is None:
        stages = {"off": parse_policy(policy_document(None, k, controller, "off"), "recommended policy")}
    else:
        stages = {m: parse_policy(policy_document(threshold, k, controller, m), f"recommended policy ({m})")
                  for m in STAGES}
    return Recommendation(threshold, k, controller, max(K_MAX, k), stages)


def write_policies(rec: Recommendation, out_dir: Path) -> dict[str, str]:
    """One YAML per rollout stage (``policy.yaml`` is the first: deploy it now); returns stage -> path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for stage, policy in rec.stages.items():
        path = out_dir / (STAGE_FILES.get(stage, OFF_FILE))
        header = f"# trtspec plan: recommended policy, rollout stage '{stage}'\n"
        path.write_text(header + dump_policy(policy))
        paths[stage] = str(path)
    return paths
