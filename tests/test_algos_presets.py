"""The ALGORITHMS table, `agentgym-rl algos`, and the KL-coefficient controllers."""

import dataclasses
import json
import math
import subprocess
import sys

import pytest
import torch

from agentgym_rl.algos import (
    ADVANTAGE,
    ALGORITHMS,
    LOSS,
    AdaptiveKLController,
    AlgorithmSpec,
    FixedKLController,
    algorithm_names,
    compute_advantages,
    entropy_loss,
    get_algorithm,
    kl_loss,
    kl_penalty,
    make_kl_controller,
    rl_objective,
    token_level_rewards,
)

NAMES = ["gigpo", "grpo", "loop", "ppo", "reinforce++", "rloo"]


def test_algorithm_names_are_the_presets_not_the_estimators():
    assert algorithm_names() == NAMES
    assert sorted(ALGORITHMS) == NAMES
    assert "gae" not in algorithm_names() and get_algorithm("ppo").advantage == "gae"


def test_cli_prints_exactly_the_algorithm_names():
    result = subprocess.run([sys.executable, "-m", "agentgym_rl.cli", "algos"], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == NAMES


def test_presets_follow_their_papers():
    gigpo, grpo, loop, ppo, rpp, rloo = (ALGORITHMS[n] for n in NAMES)
    # GiGPO (verl-agent): γ = 0.95 per turn, ω = 1, std-normalised at both levels.
    assert (gigpo.advantage, gigpo.gamma, gigpo.step_weight, gigpo.normalize_std) == ("gigpo", 0.95, 1.0, True)
    assert grpo.advantage == "grpo" and grpo.normalize_std and grpo.kl_coef == 1e-3 and grpo.kl_estimator == "k3"
    # LOOP: leave-one-out, no std, |A| < 0.01 dropped, no KL, ε = 0.1, per-token ratios
    # averaged per rollout then across rollouts, 2 epochs, no critic.
    assert (loop.advantage, loop.normalize_std, loop.drop_threshold, loop.kl_coef, loop.clip_eps) == \
        ("loop", False, 0.01, 0.0, 0.1)
    assert (loop.ratio_level, loop.aggregation, loop.epochs, loop.needs_critic) == \
        ("token", "seq-mean-token-mean", 2, False)
    assert ppo.needs_critic and ppo.value_loss == "value_clip" and ppo.advantage == "gae"
    assert rpp.kl_in_reward and rpp.kl_estimator == "k1" and not rpp.needs_critic
    assert rloo.advantage == "rloo" and not rloo.needs_critic
    assert all(not ALGORITHMS[n].needs_critic for n in NAMES if n != "ppo")
    assert all(ALGORITHMS[n].ratio_level == "token" for n in NAMES)


def test_advantage_kwargs():
    assert get_algorithm("grpo").advantage_kwargs() == {"normalize_std": True}
    assert get_algorithm("rloo").advantage_kwargs() == {}
    assert get_algorithm("gigpo").advantage_kwargs() == {"normalize_std": True, "step_weight": 1.0, "gamma": 0.95}
    assert get_algorithm("loop").advantage_kwargs() == {"drop_threshold": 0.01}
    assert get_algorithm("ppo").advantage_kwargs() == {"gamma": 1.0, "lam": 0.95, "whiten": True}
    assert get_algorithm("reinforce++").advantage_kwargs() == {"gamma": 1.0, "kl_coef": 1e-3}


def test_the_policy_loss_gets_the_recipes_settings_by_name():
    assert get_algorithm("grpo").settings_for(LOSS["ppo_clip"]) == {
        "clip_eps": 0.2, "clip_eps_high": None, "aggregation": "token-mean", "ratio_level": "token"}
    assert get_algorithm("loop").settings_for(LOSS["ppo_clip"]) == {
        "clip_eps": 0.1, "clip_eps_high": None, "aggregation": "seq-mean-token-mean", "ratio_level": "token"}


def test_a_runs_algo_section_overrides_the_recipe_field_of_the_same_name():
    from agentgym_rl.config.rl import AlgoConfig

    spec = AlgoConfig(name="loop", clip_eps_high=0.28, gamma=0.9).spec()
    assert (spec.clip_eps, spec.clip_eps_high, spec.gamma, spec.epochs) == (0.1, 0.28, 0.9, 2)
    assert spec.settings_for(LOSS["ppo_clip"])["clip_eps_high"] == 0.28
    assert AlgoConfig(name="loop").spec() == get_algorithm("loop")  # nothing set: the recipe as it is
    with pytest.raises(ValueError, match="clip_eps_high must be > 0, got 0.0"):
        dataclasses.replace(get_algorithm("grpo"), clip_eps_high=0.0)
    # TIS compares the learner's scoring with the generator's: without the former it is a no-op.
    with pytest.raises(ValueError, match="tis_cap needs recompute_old_logprobs"):
        AlgoConfig(tis_cap=2.0, recompute_old_logprobs=False)
    # Dynamic sampling refills tied groups: PPO's advantage has no groups to tie.
    with pytest.raises(ValueError, match="dynamic_sampling refills groups"):
        AlgoConfig(name="ppo", dynamic_sampling=2)
    assert AlgoConfig(name="rloo", dynamic_sampling=2).dynamic_sampling == 2
    with pytest.raises(ValueError, match="dynamic_sampling_filter keeps groups"):
        AlgoConfig(name="ppo", dynamic_sampling_filter=True)
    with pytest.raises(ValueError, match="filter_keeps_rare_actions .* needs dynamic_sampling_filter: true and a "
                                         "rare_action_bonus > 0"):
        AlgoConfig(filter_keeps_rare_actions=True, rare_action_bonus=0.5)
    with pytest.raises(ValueError, match="filter_keeps_rare_actions"):  # no bonus: a tied group has no signal
        AlgoConfig(filter_keeps_rare_actions=True, dynamic_sampling_filter=True, rare_action_bonus=0.0)
    with pytest.raises(ValueError, match="filter_keeps_rare_actions"):
        AlgoConfig(filter_keeps_rare_actions=True, dynamic_sampling_filter=True)
    assert AlgoConfig(filter_keeps_rare_actions=True, dynamic_sampling_filter=True,
                      rare_action_bonus=0.5).filter_keeps_rare_actions


def test_presets_are_frozen_and_validated():
    spec = get_algorithm("grpo")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.clip_eps = 0.3
    with pytest.raises(TypeError):
        ALGORITHMS["mine"] = spec
    with pytest.raises(ValueError,
                       match="unknown algorithm 'gae'; registered: gigpo, grpo, loop, ppo, reinforce\\+\\+, rloo"):
        get_algorithm("gae")
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        AlgorithmSpec("x", "ppo", "")
    with pytest.raises(ValueError, match="critic"):
        AlgorithmSpec("x", "gae", "", needs_critic=True)
    with pytest.raises(ValueError, match="kl field"):
        AlgorithmSpec("x", "grpo", "", kl_in_reward=True)
    with pytest.raises(ValueError, match="ratio level"):
        AlgorithmSpec("x", "grpo", "", ratio_level="step")
    assert get_algorithm("ppo").as_dict()["lam"] == 0.95


@pytest.mark.parametrize("name", NAMES)
def test_each_algorithm_runs_on_a_multi_turn_batch(name):
    # What a trainer would do with a recipe, on a batch with observation tokens between
    # turns, a group of one, and a row whose mask is empty: everything stays finite.
    spec = get_algorithm(name)
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0]] * 3 + [[0, 1, 1, 0, 1, 0, 0], [0] * 7, [1, 0, 1, 1, 0, 0, 0]],
                        dtype=torch.float)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.5])
    old = -torch.rand(6, 7, generator=g) - 0.5
    ref = old + 0.1 * torch.randn(6, 7, generator=g)
    logprobs = (old + 0.05 * torch.randn(6, 7, generator=g)).requires_grad_(True)
    fields = {"rewards": rewards, "group_ids": torch.tensor([0, 0, 0, 1, 1, 2]), "mask": mask,
              "values": torch.rand(6, 7, generator=g)}
    if spec.kl_in_reward:
        fields["kl"] = kl_penalty(old, ref, spec.kl_estimator)
    if spec.needs_critic:
        fields["token_rewards"] = token_level_rewards(rewards, mask)
    out = compute_advantages(spec.advantage, fields, **spec.advantage_kwargs())
    keep = out.keep
    values = fields["values"].clone().requires_grad_(True)
    inputs = {"logprobs": logprobs[keep], "old_logprobs": old[keep], "advantages": out.token_advantages(mask)[keep],
              "mask": mask[keep], "ref_logprobs": ref[keep], "entropy": torch.rand(6, 7, generator=g)[keep]}
    if spec.needs_critic:
        inputs.update(values=values[keep], old_values=fields["values"][keep], returns=out.returns[keep])
    loss, metrics = rl_objective(dataclasses.replace(spec, entropy_coef=1e-3), inputs)
    loss.backward()
    assert math.isfinite(loss.item()) and torch.isfinite(logprobs.grad).all()
    assert not spec.needs_critic or torch.isfinite(values.grad).all()
    assert all(math.isfinite(v) for v in {**out.metrics, **metrics}.values())
    assert (logprobs.grad[mask == 0] == 0).all()
    if name == "loop":  # group 1 (rewards 1, 1) and the singleton group 2 have A = 0: dropped
        assert keep.tolist() == [True, True, True, False, False, False]


# ------------------------------------------------------------------------ KL controllers


def test_fixed_kl_controller():
    ctl = FixedKLController(1e-3)
    assert ctl.update(100.0, n_steps=64) == 1e-3 and ctl.value == 1e-3
    state = ctl.state_dict()
    assert json.loads(json.dumps(state)) == {"kind": "fixed", "value": 1e-3}
    other = FixedKLController(0.5)
    other.load_state_dict(state)
    assert other.value == 1e-3


def test_adaptive_kl_controller_ziegler_update():
    # β = 0.1, target 6, horizon 10000 (Ziegler et al. 2019's defaults):
    #   KL 9,   1000 samples: e = clip(9/6 − 1 = 0.5, ±0.2) = 0.2  → β·(1 + 0.2·0.1)  = 0.102
    #   KL 3,    500 samples: e = clip(−0.5) = −0.2                 → β·(1 − 0.2·0.05) = 0.10098
    #   KL 6.6, 10000 samples: e = 0.1 (inside the clip)            → β·(1 + 0.1·1)    = 0.111078
    ctl = AdaptiveKLController(0.1, target=6.0, horizon=10000)
    assert ctl.update(9.0, n_steps=1000) == pytest.approx(0.102)
    assert ctl.update(3.0, n_steps=500) == pytest.approx(0.10098)
    assert ctl.update(6.6, n_steps=10000) == pytest.approx(0.111078)
    assert ctl.update(6.0, n_steps=10000) == pytest.approx(0.111078)  # on target: unchanged


def test_adaptive_kl_controller_state_round_trip(tmp_path):
    ctl = AdaptiveKLController(0.1, target=6.0, horizon=10000)
    ctl.update(9.0, n_steps=1000)
    torch.save({"kl_ctl": ctl.state_dict()}, tmp_path / "state.pt")
    resumed = AdaptiveKLController(0.1, target=6.0, horizon=10000)
    resumed.load_state_dict(torch.load(tmp_path / "state.pt")["kl_ctl"])
    assert resumed.value == pytest.approx(0.102)
    assert resumed.update(3.0, 500) == ctl.update(3.0, 500)
    with pytest.raises(ValueError, match="cannot load"):
        FixedKLController(0.1).load_state_dict(ctl.state_dict())


def test_kl_controller_validation_and_factory():
    with pytest.raises(ValueError):
        AdaptiveKLController(0.1, target=0.0, horizon=10)
    with pytest.raises(ValueError):
        AdaptiveKLController(0.0, target=1.0, horizon=10)
    with pytest.raises(ValueError, match="finite"):
        AdaptiveKLController(0.1, target=1.0, horizon=10).update(float("nan"))
    with pytest.raises(ValueError):
        FixedKLController(-1.0)
    assert isinstance(make_kl_controller("fixed", 0.01), FixedKLController)
    ctl = make_kl_controller("adaptive", 0.01, target=0.1, horizon=100)
    assert isinstance(ctl, AdaptiveKLController) and ctl.target == 0.1
    with pytest.raises(ValueError, match="needs target"):
        make_kl_controller("adaptive", 0.01)
    with pytest.raises(ValueError, match="unknown KL controller"):
        make_kl_controller("pid", 0.01)


def test_every_preset_estimator_is_registered():
    assert {spec.advantage for spec in ALGORITHMS.values()} == {"gae", "gigpo", "grpo", "loop", "reinforce++", "rloo"}
    assert all(spec.advantage in ADVANTAGE for spec in ALGORITHMS.values())
