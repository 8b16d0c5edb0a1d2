"""`rollout/backends.py` is the one place where a model becomes a rollout policy: the generator
follows `RolloutConfig`, every command builds its model policies there, and mistakes in the
choice are one-line errors before any model loads."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from agentgym_rl.agent.generator import HFGenerator
from agentgym_rl.agent.openai_generator import OpenAIGenerator
from agentgym_rl.agent.tiny import build_model
from agentgym_rl.config import RolloutConfig, TinyModelConfig
from agentgym_rl.errors import UserError
from agentgym_rl.rollout.backends import folder_policy, model_policy, samples_in_process

SMALL = TinyModelConfig(vocab_size=400, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=32)
SOURCE = Path(__file__).resolve().parent.parent / "src" / "agentgym_rl"
GENERATORS = {"HFGenerator", "VLLMGenerator", "OpenAIGenerator", "SlotGenerator", "ModelPolicy"}
# Where else a generator may be built: serve-model samples for its clients, not for a rollout.
OTHER_BUILDERS = {"rollout/backends.py", "server/model_server.py"}


def test_only_the_backends_module_builds_model_policies():
    builders = set()
    for path in SOURCE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in GENERATORS:
                builders.add(str(path.relative_to(SOURCE)))
    assert builders == OTHER_BUILDERS


def test_a_model_policy_generates_with_the_rollout_settings(tiny_tokenizer):
    model = build_model(tiny_tokenizer, SMALL)
    policy = model_policy(model, tiny_tokenizer, 0.5, RolloutConfig(reuse_kv_cache=False, threads=1),
                          listed_actions_only=True)
    generator = policy.generator
    assert isinstance(generator, HFGenerator) and generator.model is model
    assert (generator.temperature, generator.reuse_cache, generator.threads) == (0.5, False, 1)
    assert policy.listed_actions_only and policy.encoder.end_of_turn_id in generator.stop_ids
    default = model_policy(model, tiny_tokenizer, 0.0).generator
    assert (default.reuse_cache, default.threads) == (RolloutConfig().reuse_kv_cache, RolloutConfig().threads)


@pytest.fixture
def folder(tmp_path, tiny_tokenizer) -> Path:
    build_model(tiny_tokenizer, SMALL).save_pretrained(tmp_path)
    tiny_tokenizer.save_pretrained(tmp_path)
    return tmp_path


def test_the_backend_follows_the_rollout_config(folder, monkeypatch):
    assert samples_in_process(RolloutConfig())
    assert not samples_in_process(RolloutConfig(generator_url="http://127.0.0.1:9/v1"))
    assert not samples_in_process(RolloutConfig(generator="vllm"))
    served = RolloutConfig(generator_url="http://127.0.0.1:9/v1")
    with pytest.raises(UserError, match="needs the model generating in this process"):
        folder_policy(folder, 0.0, served, listed_actions_only=True)
    monkeypatch.setattr(OpenAIGenerator, "__init__", lambda self, *args, **kwargs: setattr(self, "client", Models()))
    policy = folder_policy(folder, 0.0, served)  # the folder's tokenizer encodes; its model is not loaded
    assert isinstance(policy.generator, OpenAIGenerator) and policy.generator.model == "served-model"


class Models:
    """What `folder_policy` asks a served model's client: its model names."""

    def models(self) -> list[str]:
        return ["served-model"]



def test_the_config_names_every_backend_the_table_has():
    from typing import get_args

    from agentgym_rl.config.sections import RolloutConfig as Section
    from agentgym_rl.rollout.backends import BACKENDS

    assert set(get_args(Section.__pydantic_fields__["generator"].annotation)) == set(BACKENDS) - {"served"}


def test_what_a_run_refuses_follows_the_backends_row(tmp_path, monkeypatch, counter_env_registered):
    """Each check reads the table: a row that says no makes the trainer, evaluation and the
    config's checks refuse the setting, naming the backend, before any work."""
    import dataclasses

    from test_run_safety import toy_config

    import agentgym_rl.rollout.backends as backends
    from agentgym_rl.train.rl import RLTrainer, not_alongside

    original = backends.BACKENDS["hf"]

    def row(**changes):  # the "hf" row with these changes alone
        monkeypatch.setitem(backends.BACKENDS, "hf", dataclasses.replace(original, **changes))

    row(asynchronous=False)
    assert not_alongside(toy_config(tmp_path, "train.asynchronous=true"), 1) == \
        "train.asynchronous does not run with rollout.generator: hf yet: drop one of the two"
    row(trains=False)
    with pytest.raises(UserError, match="transformers in this process samples with weights the learner cannot"):
        RLTrainer(toy_config(tmp_path), log=lambda _: None)
    row(lora=False)
    with pytest.raises(UserError, match="rollout.generator: hf does not take LoRA adapters"):
        RLTrainer(toy_config(tmp_path, "model.lora_rank=4"), log=lambda _: None)
    row(ray_workers=False)
    with pytest.raises(UserError, match="rollout.workers do not run transformers in this process"):
        RLTrainer(toy_config(tmp_path, "rollout.workers=1"), log=lambda _: None)

    def missing() -> None:
        raise UserError("hf needs a package: pip install it")

    row(requires=missing)
    with pytest.raises(UserError, match="hf needs a package"):
        RLTrainer(toy_config(tmp_path), log=lambda _: None)
    with pytest.raises(UserError, match="hf needs a package"):
        folder_policy(tmp_path, 1.0, RolloutConfig())
    row(in_process=False)
    with pytest.raises(UserError, match="--listed-actions-only needs the model generating in this process"):
        folder_policy(tmp_path, 1.0, RolloutConfig(), listed_actions_only=True)
    assert not samples_in_process(RolloutConfig())


def test_the_slot_generators_slots_are_max_envs_or_what_the_kv_budget_holds(tiny_tokenizer):
    from agentgym_rl.rollout.backends import MOST_SLOTS, slot_count

    model = build_model(tiny_tokenizer, SMALL)  # 2 x 1 layer x 1 head x 8 dims x 4 bytes = 64 bytes a token
    assert slot_count(model, RolloutConfig(generator="slots", max_envs=3)) == 3
    # 1 MiB / (64 bytes x 2,048 tokens) = 8 slots
    assert slot_count(model, RolloutConfig(generator="slots", max_envs=0, kv_cache_mb=1, max_context=2048)) == 8
    assert slot_count(model, RolloutConfig(generator="slots", max_envs=0, kv_cache_mb=4096)) == MOST_SLOTS
    policy = model_policy(model, tiny_tokenizer, 1.0, RolloutConfig(generator="slots", max_envs=0, kv_cache_mb=1,
                                                                    max_context=2048))
    assert policy.generator.slots == policy.max_batch == 8


def test_stop_strings_end_replies_at_every_token_holding_them(tiny_tokenizer):
    model = build_model(tiny_tokenizer, SMALL)
    end = model_policy(model, tiny_tokenizer, 0.0).encoder.end_of_turn_id
    assert model_policy(model, tiny_tokenizer, 0.0).generator.stop_ids == [end]
    stops = model_policy(model, tiny_tokenizer, 0.0, RolloutConfig(stop_strings=["\n"])).generator.stop_ids
    [newline] = tiny_tokenizer.encode("\n", add_special_tokens=False)
    assert stops[0] == end and newline in stops and len(set(stops)) == len(stops)
    special = set(tiny_tokenizer.all_special_ids)
    assert set(stops[1:]) == {i for i in range(len(tiny_tokenizer))
                              if i not in special and "\n" in tiny_tokenizer.decode([i])}
    assert not set(tiny_tokenizer.encode("count", add_special_tokens=False)) & set(stops)
    with pytest.raises(UserError, match="no token of the tokenizer holds '§'"):
        model_policy(model, tiny_tokenizer, 0.0, RolloutConfig(stop_strings=["§"]))
    with pytest.raises(UserError, match="use one of them"):
        model_policy(model, tiny_tokenizer, 0.0, RolloutConfig(stop_strings=["\n"]), listed_actions_only=True)
    with pytest.raises(ValueError, match="at least 1 character"):
        RolloutConfig(stop_strings=[""])


def test_the_table_builds_each_backends_generator_and_starts_its_engine(folder, monkeypatch, tiny_tokenizer):
    """Every policy's generator comes from its row's `build`, and a row with an `engine` has it
    started on the model folder (once, with the run's dtype, settings and seed) and handed over:
    a backend is one row."""
    import dataclasses

    import agentgym_rl.rollout.backends as backends

    built, started = [], []

    def build(parts):
        built.append(parts)
        return HFGenerator(parts.model, parts.pad_id, parts.stops, parts.temperature) if parts.model else parts

    def start(where, dtype, rollout, seed):
        started.append((where, dtype, rollout.max_context, seed))
        return "the engine"

    monkeypatch.setitem(backends.BACKENDS, "hf", dataclasses.replace(backends.BACKENDS["hf"], build=build))
    model = build_model(tiny_tokenizer, SMALL)
    assert model_policy(model, tiny_tokenizer, 0.3).generator.model is model
    assert (built[-1].model, built[-1].temperature, built[-1].engine) == (model, 0.3, None)
    folder_policy(folder, 0.0, RolloutConfig(), dtype="float32", device="cpu")
    assert built[-1].model is not None and built[-1].model is not model  # the folder's model, loaded here

    engined = dataclasses.replace(backends.BACKENDS["hf"], in_process=False, engine=start)
    monkeypatch.setitem(backends.BACKENDS, "hf", engined)
    folder_policy(folder, 0.0, RolloutConfig(max_context=640), dtype="bfloat16", seed=7)
    assert started == [(folder, "bfloat16", 640, 7)]
    assert (built[-1].model, built[-1].engine) == (None, "the engine")  # its model stays where the engine is
    with pytest.raises(ValueError, match="needs engine"):
        model_policy(model, tiny_tokenizer, 0.0)


def test_a_backend_is_refused_on_a_device_its_row_does_not_list(tmp_path, monkeypatch, counter_env_registered):
    import dataclasses

    from test_run_safety import toy_config

    import agentgym_rl.rollout.backends as backends
    from agentgym_rl.train.rl import RLTrainer

    monkeypatch.setitem(backends.BACKENDS, "hf", dataclasses.replace(backends.BACKENDS["hf"], devices=("cuda",)))
    said = re.escape("transformers in this process does not sample on cpu (it does on cuda): set run.device or "
                     "rollout.generator")
    with pytest.raises(UserError, match=f"^{said}$"):
        RLTrainer(toy_config(tmp_path, "run.device=cpu"), log=lambda _: None)
    with pytest.raises(UserError, match=f"^{said}$"):
        folder_policy(tmp_path, 1.0, RolloutConfig(), device="cpu")


def test_a_run_starts_its_backends_engine_once_on_the_learners_weights(tmp_path, monkeypatch, counter_env_registered):
    """The trainer's rollout and validation policies share one engine, started from a folder of
    the model as the run begins (vLLM's path, with a stand-in engine)."""
    import dataclasses

    from test_run_safety import toy_config

    import agentgym_rl.rollout.backends as backends
    from agentgym_rl.train.rl import RLTrainer

    started, engines = [], []

    def start(where, dtype, rollout, seed):
        started.append((Path(where).relative_to(tmp_path), dtype, seed, (Path(where) / "config.json").is_file()))
        return object()

    def build(parts):
        engines.append(parts.engine)
        return HFGenerator(parts.model, parts.pad_id, parts.stops, parts.temperature)

    row = dataclasses.replace(backends.BACKENDS["hf"], build=build, engine=start)
    monkeypatch.setitem(backends.BACKENDS, "hf", row)
    RLTrainer(toy_config(tmp_path, "train.steps=1", "run.seed=5", "run.dtype=bfloat16"), log=lambda _: None).fit()
    assert started == [(Path("toy/engine_model"), "bfloat16", 5, True)]
    assert len(engines) >= 2 and all(engine is engines[0] for engine in engines)
