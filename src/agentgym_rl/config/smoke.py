"""The smoke preset (`--smoke`): any config, shrunk to run end to end in about a minute on a
2-core CPU and still update the policy from a real signal.

A few RL steps of a barely trained model get no signal on their own: every reply is invalid,
every group ties at reward 0 and GRPO updates nothing. So the RL preset warms the tiny model up
on actions alone (no thoughts) with small batches, samples at temperature 0.5 in groups of 8,
and takes `env.invalid_action_penalty` off each rejected action: samples of a group then differ
in how many of their actions were valid, and their advantages are not all zero. A pretrained
model (`model.path` set) keeps its own start (no warm-up), plays fewer, shorter episodes for one
step, and takes `algo.invalid_turn_penalty` off the token where a rejected action went wrong.

The preset goes before the command's own `key=value` overrides, which can change any of it;
the run is named `<run.name>_smoke` and started afresh on every smoke run (`run.smoke`: only a
smoke run's folder is ever replaced, whatever `run.name` says). An RL smoke run keeps no
checkpoint unless its overrides ask for one (`train.save_every=2`).
"""

from __future__ import annotations

from typing import Any

_RUN = ["run.overwrite=true", "run.smoke=true"]
_EVAL = ["eval.episodes=2", "eval.max_turns=3"]
_TINY_MODEL = ["model.corpus_episodes=60"]
_WARMUP = ["warmup.episodes=60", "warmup.epochs=2", "warmup.batch_size=2", "warmup.thoughts=false",
           "warmup.augment=0", "warmup.perturb=0", "warmup.optim.lr=0.001", "warmup.optim.micro_batch_size=2"]
# No checkpoint (a SmolLM2 smoke run's was 1.6 GB) and so no journal, which resumes from one:
# `train.save_every=2` after --smoke keeps one.
_RL = ["train.steps=2", "train.validate_every=2", "train.save_every=0", "rollout.journal_every=0", "schedule.kind=fixed",
       "env.invalid_action_penalty=0.1", "algo.temperature=0.5"]
_RL_TINY = ["schedule.horizons=[3]", "algo.tasks_per_step=4", "algo.group_size=8", "algo.minibatch_size=32"]
# A 135M model's update on the CPU costs ~10 s per episode of two turns (TextCraft's prompt is
# ~900 tokens): one step of one group of 2. An instruct model may write no valid action at all
# (SmolLM2 on TextCraft) and its group then ties: the penalty on the token where a rejected
# action went wrong gives it a signal.
_RL_PRETRAINED = ["train.steps=1", "schedule.horizons=[2]", "algo.tasks_per_step=1", "algo.group_size=2",
                  "algo.minibatch_size=2", "eval.max_turns=2", "algo.invalid_turn_penalty=0.5"]
# Environments slower to play than BabyAI, kept near a minute: SciWorld's expert plays ~40 turns
# an episode (BabyAI's ~5); the web environment plays ~1.5 episodes a second in Chromium.
# SciWorld's warmed-up tiny model writes three rejected actions an episode, every one of them
# (reward -0.3, all groups tie): the penalty on the token where each went wrong gives the update
# a signal, as for a pretrained model (`make smoke`, 2026-12-04: both steps updated with it, none
# without).
_SLOW_ENVS = {"sciworld": ["warmup.episodes=12", "model.corpus_episodes=12", "algo.invalid_turn_penalty=0.5"],
              "web": ["warmup.episodes=24", "model.corpus_episodes=24", "algo.tasks_per_step=2"]}
# RFT learns only from successful samples, so its tiny model is warmed up on twice the
# demonstrations (a few GoTo items are then solved in a turn or two); DPO pairs samples that
# differ in reward, which the penalty for invalid actions provides as in RL.
_IMITATION_START = ["model.path=null", "model.corpus_episodes=120", *_WARMUP, "warmup.episodes=120"]
_SAMPLING = ["items=12", "samples_per_item=4", "max_turns=6"]  # DPO's data and RFT's rounds


def smoke_overrides(kind: str, data: dict[str, Any]) -> list[str]:
    """The preset for a config of `kind` (train, sft, dpo, rft) whose YAML holds `data`."""
    name = (data.get("run") or {}).get("name") or kind
    pretrained = (data.get("model") or {}).get("path") is not None
    env_id = (data.get("env") or {}).get("id")
    preset = [*_RUN, f"run.name={name}_smoke", *_EVAL]
    if kind == "train":
        preset += _RL + (_RL_PRETRAINED if pretrained else [*_RL_TINY, *_TINY_MODEL, *_WARMUP])
        if not pretrained:
            preset += _SLOW_ENVS.get(env_id, [])
    elif kind == "sft":
        preset += ["data.episodes=60", "train.epochs=2", *([] if pretrained else _TINY_MODEL)]
    else:
        # DPO and RFT start from a folder another run wrote (an SFT model); the smoke run
        # builds and warms up its own tiny model instead.
        section = "data" if kind == "dpo" else "rft"
        start = ["model.path=null", *_TINY_MODEL, *_WARMUP] if kind == "dpo" else _IMITATION_START
        preset += [*start, *(f"{section}.{key}" for key in _SAMPLING)]
        # Listed actions make BabyAI's episodes long: the recipes' 1,024-token cap would drop them all.
        preset += (["dpo.epochs=1", "dpo.max_tokens=4096", "env.invalid_action_penalty=0.1"] if kind == "dpo"
                   else ["rft.rounds=1", "rft.temperature=0.5", "train.epochs=1", "train.max_tokens=4096"])
    return preset
