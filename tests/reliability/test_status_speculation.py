"""The status's ``speculation`` speaks of what new requests get: their drafter is the deployment's
``default_drafter``, and the draft model's health and the breaker gate the draft model only."""

from __future__ import annotations

import pytest

from trtspec.control import SpeculationGovernor
from trtspec.control.breaker import BreakerState
from trtspec.control.config import BreakerConfig, Policy, RolloutConfig, RolloutMode
from trtspec.decoding import DrafterKind
from trtspec.serving.supervisor import ModelSupervisor
from trtspec.serving.triton.health import DeploymentHealth, HealthConfig
from trtspec.testing import fake_triton


def _health(drafter: DrafterKind, *, draft: bool, policy: Policy | None = None) -> DeploymentHealth:
    gov = SpeculationGovernor(policy or Policy(breaker=BreakerConfig(min_tokens=10)))
    health = DeploymentHealth(fake_triton, HealthConfig(default_drafter=drafter), gov, model_name="spec_decode",
                              pool_size=2)
    health.draft = ModelSupervisor("draft") if draft else None
    return health


def _open_breaker(health: DeploymentHealth) -> None:
    health.governor.breaker.observe(drafted=50, accepted=0)
    assert health.governor.breaker.state is BreakerState.OPEN


@pytest.mark.parametrize("drafter", [DrafterKind.NGRAM, DrafterKind.SUFFIX])
def test_a_free_default_drafter_speculates_without_a_draft_model_and_past_an_open_breaker(drafter):
    assert _health(drafter, draft=False).speculation()[0] == "on"
    health = _health(drafter, draft=True)
    _open_breaker(health)
    mode, why = health.speculation()
    assert mode == "on" and drafter.value in why


def test_the_model_drafter_is_off_without_a_draft_model_or_with_the_breaker_open():
    assert _health(DrafterKind.MODEL, draft=False).speculation() == ("off", "no draft model deployed")
    health = _health(DrafterKind.MODEL, draft=True)
    assert health.speculation()[0] == "on"
    _open_breaker(health)
    assert health.speculation() == ("off", "breaker open")


def test_auto_goes_on_with_its_free_drafter_where_the_model_cannot_draft():
    mode, why = _health(DrafterKind.AUTO, draft=False).speculation()
    assert mode == "on" and why.startswith("no draft model deployed") and "ngram/suffix alone" in why
    health = _health(DrafterKind.AUTO, draft=True)
    assert health.speculation()[0] == "on"
    _open_breaker(health)
    mode, why = health.speculation()
    assert mode == "degraded" and why.startswith("breaker open") and "ngram/suffix alone" in why


@pytest.mark.parametrize("drafter", list(DrafterKind))
def test_rollout_off_turns_every_drafter_off(drafter):
    policy = Policy(rollout=RolloutConfig(mode=RolloutMode.OFF))
    assert _health(drafter, draft=True, policy=policy).speculation() == ("off", "rollout mode off")


def test_the_status_carries_the_draft_models_goodput_estimates():
    """What ``trtspec status`` prints on its ``goodput`` line: the k the controller would draft now
    and what it is based on; none without a draft model, or under a controller that estimates nothing."""
    gov = _health(DrafterKind.MODEL, draft=True).snapshot()["governor"]["goodput"]
    assert gov["young"] and gov["k_best_now"] > 0  # nothing measured yet: the priors say drafting pays
    assert 0 < gov["breakeven_acceptance"] < 1 and len(gov["acceptance_per_position"]) == Policy().draft_length.k_max
    assert _health(DrafterKind.MODEL, draft=False).snapshot()["governor"]["goodput"] is None
    static = Policy(draft_length={"controller": "static"})
    assert _health(DrafterKind.MODEL, draft=True, policy=static).snapshot()["governor"]["goodput"] is None
