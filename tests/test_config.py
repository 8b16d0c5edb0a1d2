"""Configs: every YAML in configs/ loads; mistakes in keys, types and values are clear one-line
errors raised before any work."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from agentgym_rl.config import DPOConfig, RFTConfig, RLConfig, SFTConfig, load_config, to_dict
from agentgym_rl.envs import env_ids
from agentgym_rl.errors import UserError

REPO = Path(__file__).resolve().parent.parent
CONFIGS = sorted((REPO / "configs").rglob("*.yaml")) + [
    Path(str(resources.files("agentgym_rl") / "configs" / "quickstart.yaml"))]


def config_class(path: Path) -> type:
    """Each command's config class, by the file name's suffix (as the README's table says)."""
    for suffix, cls in (("_sft", SFTConfig), ("_dpo", DPOConfig), ("_rft", RFTConfig)):
        if path.stem.endswith(suffix):
            return cls
    return RLConfig


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_config_loads_and_names_real_components(path):
    config = load_config(config_class(path), path)
    assert config.env.id in env_ids()
    assert config.run.name == path.stem
    if isinstance(config, RLConfig):
        assert config.algo.spec().name == config.algo.name


STUDIES = sorted((REPO / "bench" / "studies").glob("*.yaml"))


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.name)
def test_every_study_arm_is_a_valid_override_of_its_recipe(path):
    """`bench/strong_agent.py` runs each arm as `train RECIPE *overrides`: a typo would surface
    only after the arms before it had run for an hour."""
    import yaml

    study = yaml.safe_load(path.read_text())
    recipe = REPO / study["config"]
    for overrides in study["arms"].values():
        # `{warmup}` is the shared warm-up's model folder, known once that arm has run.
        load_config(config_class(recipe), recipe, [o.replace("{warmup}", "runs/x/warmup_model") for o in overrides or []])


def test_a_saved_config_loads_back_equal(tmp_path):
    import yaml

    config = load_config(RLConfig, REPO / "configs" / "babyai_ppo.yaml", ["algo.gamma=0.9"])
    saved = tmp_path / "config.yaml"
    saved.write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
    assert load_config(RLConfig, saved) == config


def test_overrides_are_typed_and_nested():
    config = load_config(RLConfig, None, ["algo.group_size=4", "schedule.horizons=[2,4]", "optim.lr=0.01",
                                          "model.path=null", "run.name=x", "algo.max_kl=1e-9"])
    assert config.algo.group_size == 4 and config.schedule.horizons == [2, 4]
    assert config.optim.lr == 0.01 and config.model.path is None and config.run.name == "x"
    assert config.algo.max_kl == 1e-9  # YAML 1.1 reads "1e-9" as a string: still a number here


@pytest.mark.parametrize("override, message", [
    # keys
    ("algo.nope=1", "unknown config key 'algo.nope'; known here: aggregation, clip_eps"),
    ("run_name=x", "unknown config key 'run_name': it is 'run.name' now"),
    ("train.validation_episodes=3", "unknown config key 'train.validation_episodes': it is 'eval.episodes' now"),
    ("algo.group_size", "not of the form key=value"),
    ("algo=3", "config key 'algo': input should be a dictionary"),
    # types
    ("algo.group_size=many", "config key 'algo.group_size': input should be a valid integer"),
    ("schedule.horizons=[1, x]", "config key 'schedule.horizons[1]': input should be a valid integer"),
    ("train.save_trajectories=maybe", "config key 'train.save_trajectories': input should be a valid boolean"),
    ("model.path=3", "config key 'model.path': input should be a valid string"),
    ("run.malloc_mmap_threshold_kb=big", "config key 'run.malloc_mmap_threshold_kb': input should be a valid integer, "
     "unable to parse string as an integer; or 'auto', got 'big'"),  # a union: every member's complaint, one key
    # values
    ("algo.group_size=0", "config key 'algo.group_size': input should be greater than or equal to 1, got 0"),
    ("algo.group_size=1", "bad config in algo: group_size must be >= 2 for grpo"),
    ("algo.tasks_per_step=0", "config key 'algo.tasks_per_step': input should be greater than or equal to 1"),
    ("optim.lr=-0.001", "config key 'optim.lr': input should be greater than 0, got -0.001"),
    ("train.steps=-1", "config key 'train.steps': input should be greater than or equal to 1, got -1"),
    ("eval.max_turns=0", "config key 'eval.max_turns': input should be greater than or equal to 1, got 0"),
    ("algo.temperature=0", "config key 'algo.temperature': input should be greater than 0"),
    ("algo.clip_eps=-0.2", "config key 'algo.clip_eps': input should be greater than 0"),
    ("optim.lr_schedule=linear", "config key 'optim.lr_schedule': input should be 'constant' or 'cosine'"),
    ("algo.name=ppo2", "bad config in algo: unknown algorithm 'ppo2'"),
    ("algo.aggregation=sum", "bad config in algo: grpo: unknown aggregation 'sum'"),
    ("schedule.kind=linear", "bad config in schedule:"),
    ("model.tiny.num_heads=3", "bad config in model.tiny: hidden_size (128) must be a multiple of num_heads (3)"),
    # a run folder outside run.output_dir would be written there (and emptied by --overwrite)
    ("run.name=/", "bad config in run: run.name must name a folder inside run.output_dir"),
    ("run.name=../mine", "bad config in run: run.name must name a folder inside run.output_dir"),
    ("run.name=.", "bad config in run: run.name must name a folder inside run.output_dir"),
])
def test_bad_keys_types_and_values_are_one_line_errors(override, message):
    with pytest.raises(UserError) as caught:
        load_config(RLConfig, None, [override])
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_group_size_one_is_fine_for_an_algorithm_without_groups():
    assert load_config(RLConfig, None, ["algo.name=ppo", "algo.group_size=1"]).algo.group_size == 1


@pytest.mark.parametrize("cls, override, message", [
    (SFTConfig, "train.packing=true", "bad config in train: pack_tokens (2048) must be >= max_tokens (4096)"),
    (DPOConfig, "optim.micro_batch_size=3", "optim.micro_batch_size must be even for DPO"),
    (DPOConfig, "dpo.label_smoothing=0.5", "config key 'dpo.label_smoothing': input should be less than 0.5"),
    (RFTConfig, "rft.samples_per_item=0", "config key 'rft.samples_per_item'"),
    (SFTConfig, "data.env=babyai", "unknown config key 'data.env': it is 'env.id' now"),
])
def test_imitation_configs_check_their_values(cls, override, message):
    with pytest.raises(UserError) as caught:
        load_config(cls, None, [override])
    assert message in str(caught.value)


def test_python_construction_checks_values_too():
    from agentgym_rl.config import AlgoConfig

    with pytest.raises(ValueError):
        AlgoConfig(group_size=0)


def test_malformed_yaml_names_the_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("algo:\n  name: grpo\n  group_size: [1,\n")
    with pytest.raises(UserError, match="line"):
        load_config(RLConfig, path)
    with pytest.raises(UserError, match="does not exist"):
        load_config(RLConfig, tmp_path / "missing.yaml")
    with pytest.raises(UserError, match="is a folder; give a YAML file"):
        load_config(RLConfig, tmp_path)
    (tmp_path / "utf16.yaml").write_text("train: {steps: 2}", encoding="utf-16")
    with pytest.raises(UserError, match="is not a UTF-8 text file"):
        load_config(RLConfig, tmp_path / "utf16.yaml")
    # YAML's merge key is not a key given twice: an anchored section reused, one key overridden
    (tmp_path / "merged.yaml").write_text("optim: &base {lr: 0.1, grad_clip: 0.5}\n"
                                          "eval: {episodes: 3}\nx: {<<: *base, lr: 0.2}\n")
    from agentgym_rl.config import load_yaml
    assert load_yaml(tmp_path / "merged.yaml")["x"] == {"lr": 0.2, "grad_clip": 0.5}
    (tmp_path / "twice.yaml").write_text("optim:\n  lr: 0.1\n  grad_clip: 1.0\n  lr: 0.2\n")
    with pytest.raises(UserError, match="line 4 is not valid YAML: the key 'lr' is given twice"):
        load_config(RLConfig, tmp_path / "twice.yaml")


# ------------------------------------------------------------- agentgym-rl config


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_the_config_command_prints_every_key_under_its_description(path):
    import yaml
    from test_cli import run

    from agentgym_rl.config.describe import config_class

    result = run("config", str(path), "run.seed=7")
    assert result.returncode == 0, result.stderr
    cls = config_class(path, "auto")
    assert cls.__name__ == {"dpo": "DPOConfig", "rft": "RFTConfig", "sft": "SFTConfig"}.get(path.stem.split("_")[-1],
                                                                                               "RLConfig")
    assert yaml.safe_load(result.stdout) == to_dict(load_config(cls, path, ["run.seed=7"]))  # the resolved config
    lines = result.stdout.splitlines()
    for number, line in enumerate(lines):
        if line.strip() and not line.lstrip().startswith("#"):
            assert lines[number - 1].lstrip().startswith("#"), f"no description above {line!r}"


def test_a_printed_string_with_a_line_break_stays_on_its_line_and_loads_back():
    import yaml

    from agentgym_rl.config.describe import described_yaml

    config = load_config(RLConfig, REPO / "configs" / "smollm2_babyai_grpo.yaml", ['rollout.stop_strings=["\\n"]'])
    text = described_yaml(config)
    assert '  stop_strings: ["\\n"]' in text.splitlines()
    assert yaml.safe_load(text) == to_dict(config)


def test_the_config_command_lists_every_key_with_type_default_and_description():
    from test_cli import run

    for kind in ("train", "sft", "dpo", "rft"):
        result = run("config", str(REPO / "configs" / "babyai_grpo.yaml"), "--kind", kind, "--keys")
        assert result.returncode == 0, result.stderr
        rows = result.stdout.splitlines()
        assert rows and all("  # " in row for row in rows), [row for row in rows if "  # " not in row]
    assert any(row.startswith("algo.kl_horizon ") and "int = 10000" in row for row in
               run("config", str(REPO / "configs" / "babyai_grpo.yaml"), "--keys").stdout.splitlines())
    wrong = run("config", str(REPO / "configs" / "babyai_grpo.yaml"), "--kind", "magic")
    assert wrong.returncode == 2 and "--kind must be auto or one of train, sft, dpo, rft" in wrong.stderr


def test_a_config_given_to_the_wrong_command_names_the_command_that_runs_it():
    from test_cli import run

    from agentgym_rl.config.describe import load_for_command

    sft = REPO / "configs" / "babyai_sft.yaml"
    result = run("train", str(sft))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{sft} is a config for `agentgym-rl sft`: run `agentgym-rl sft {sft}`" in result.stderr
    for command, path, right in (("sft", "babyai_grpo.yaml", "train"), ("train", "babyai_dpo.yaml", "dpo"),
                                 ("dpo", "babyai_rft.yaml", "rft")):
        with pytest.raises(UserError, match=f"is a config for `agentgym-rl {right}`"):
            load_for_command(command, REPO / "configs" / path, [])
    # A mistaken key in a file the command runs is told as it was, with no other command named.
    with pytest.raises(UserError) as error:
        load_for_command("train", REPO / "configs" / "babyai_grpo.yaml", ["algo.bogus=1"])
    assert "unknown config key 'algo.bogus'" in str(error.value) and "is a config for" not in str(error.value)
    assert isinstance(load_for_command("rft", REPO / "configs" / "babyai_rft.yaml", []), RFTConfig)


def test_the_config_command_tells_an_rl_file_from_its_values_when_its_sections_are_ambiguous(tmp_path):
    from agentgym_rl.config.describe import config_class

    (tmp_path / "steps.yaml").write_text("train: {steps: 2}\n")  # SFT has a train section too
    (tmp_path / "epochs.yaml").write_text("train: {epochs: 2}\n")
    assert config_class(tmp_path / "steps.yaml", "auto") is RLConfig
    assert config_class(tmp_path / "epochs.yaml", "auto") is SFTConfig


def test_every_name_the_config_package_exports_resolves():
    """The package loads its submodules on first use: a name filed under the wrong submodule
    would fail only where it is first used."""
    import agentgym_rl.config as package

    for name in package.__all__:
        getattr(package, name)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        package.Nope


def test_a_runs_config_file_keeps_a_line_break_on_its_keys_line(tmp_path):
    from agentgym_rl.runs import CONFIG, write_config

    config = load_config(RLConfig, REPO / "configs" / "smollm2_babyai_grpo.yaml", ['rollout.stop_strings=["\\n"]'])
    write_config(tmp_path, config)
    text = (tmp_path / CONFIG).read_text()
    assert '  - "\\n"' in text.splitlines()
    assert load_config(RLConfig, tmp_path / CONFIG) == config
