"""What a run does with a user's mistakes and accidents: resuming with another config, a damaged
checkpoint, a run folder that cannot be written, steps that update nothing; and the logprob gap
between the generator and the learner that every RL step logs."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import yaml
from test_cli import run

from agentgym_rl.config import RLConfig, load_config
from agentgym_rl.errors import UserError
from agentgym_rl.train.rl import RLTrainer, no_update_reason

REPO = Path(__file__).resolve().parent.parent
TOY = ["model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1",
       "model.tiny.intermediate_size=64", "model.tiny.vocab_size=320", "env.id=counter", "env.kwargs={}",
       "warmup.episodes=0", "model.corpus_episodes=6", "algo.tasks_per_step=2", "algo.group_size=3",
       "algo.minibatch_size=4", "rollout.max_new_tokens=6", "schedule.horizons=[2]", "train.validate_every=0",
       "train.save_every=1", "optim.micro_batch_size=2"]


def toy_config(tmp_path, *extra: str) -> RLConfig:
    return load_config(RLConfig, REPO / "configs" / "babyai_grpo.yaml",
                       [*TOY, f"run.output_dir={tmp_path}", "run.name=toy", *extra])


def test_resume_refuses_a_config_that_changes_what_the_checkpoints_hold(tmp_path, counter_env_registered):
    RLTrainer(toy_config(tmp_path, "train.steps=1"), log=lambda _: None).fit()
    changed = toy_config(tmp_path, "train.steps=2", "algo.name=ppo", "model.tiny.hidden_size=64")
    with pytest.raises(UserError) as caught:
        RLTrainer(changed, log=lambda _: None).fit(resume=True)
    message = str(caught.value)
    assert "algo.name ('grpo' -> 'ppo')" in message and "model.tiny.hidden_size (32 -> 64)" in message
    assert "\n" not in message
    said: list[str] = []  # the config the run started with: nothing to say
    RLTrainer(toy_config(tmp_path, "train.steps=1"), log=said.append).fit(resume=True)
    assert any(line.startswith("resumed from") for line in said) and not any("note: resumed" in x for x in said)
    # More steps, another learning rate or validation settings are fine to change, and said.
    said: list[str] = []
    RLTrainer(toy_config(tmp_path, "train.steps=2", "optim.lr=0.01"), log=said.append).fit(resume=True)
    assert "note: resumed with settings other than those the run started with (config.yaml): optim.lr (0.0005 -> " \
           "0.01), train.steps (1 -> 2)" in said, said
    rows = [json.loads(line) for line in (tmp_path / "toy" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]


def test_a_resume_names_a_dropped_setting_and_not_a_key_an_older_version_did_not_save(tmp_path):
    from agentgym_rl.config import to_dict
    from agentgym_rl.train.rl import resumed_changes

    started = to_dict(toy_config(tmp_path, "env.kwargs.list_actions=true"))
    del started["algo"]["idle_turn_penalty"]  # as a run saved before the key existed
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(started))
    assert resumed_changes(tmp_path, toy_config(tmp_path)) == ["env.kwargs.list_actions (True -> <unset>)"]
    assert resumed_changes(tmp_path, toy_config(tmp_path, "env.kwargs.list_actions=true")) == []
    started["algo"]["gone_key"] = 1  # a key this version no longer has: what both hold is compared
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(started))
    assert resumed_changes(tmp_path, toy_config(tmp_path, "env.kwargs.list_actions=true", "optim.lr=0.01")) == \
        ["optim.lr (0.0005 -> 0.01)"]


def test_a_damaged_latest_checkpoint_falls_back_to_the_one_before(tmp_path, counter_env_registered):
    RLTrainer(toy_config(tmp_path, "train.steps=2"), log=lambda _: None).fit()
    latest = tmp_path / "toy" / "checkpoints" / "step_000002"
    (latest / "learner.pt").write_bytes(b"cut short")
    said: list[str] = []
    RLTrainer(toy_config(tmp_path, "train.steps=3"), log=said.append).fit(resume=True)
    assert any(line.startswith(f"warning: checkpoint {latest} cannot be loaded") for line in said)
    assert any("resumed from" in line and "step_000001" in line for line in said)
    rows = [json.loads(line) for line in (tmp_path / "toy" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]  # step 2 was trained again, then step 3


def test_keep_checkpoints_deletes_older_ones_after_each_save_and_the_run_resumes(tmp_path, counter_env_registered):
    said: list[str] = []
    RLTrainer(toy_config(tmp_path, "train.steps=3", "train.keep_checkpoints=2"), log=said.append).fit()
    folder = tmp_path / "toy" / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["step_000002", "step_000003"]
    assert [line for line in said if line.startswith("deleted")] == \
        ["deleted checkpoint step_000001 (train.keep_checkpoints=2)"]
    RLTrainer(toy_config(tmp_path, "train.steps=4", "train.keep_checkpoints=1"), log=lambda _: None).fit(resume=True)
    assert sorted(p.name for p in folder.iterdir()) == ["step_000004"]
    rows = [json.loads(line) for line in (tmp_path / "toy" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]


def test_pruning_keeps_every_checkpoint_while_the_newest_is_damaged(tmp_path, counter_env_registered):
    from agentgym_rl.runs import prune_checkpoints

    RLTrainer(toy_config(tmp_path, "train.steps=3"), log=lambda _: None).fit()
    run_dir = tmp_path / "toy"
    newest = run_dir / "checkpoints" / "step_000003" / "model" / "model.safetensors"
    whole = newest.read_bytes()
    newest.write_bytes(whole[: len(whole) // 2])  # a write cut short
    assert prune_checkpoints(run_dir, 1) == []
    newest.write_bytes(whole)
    assert [p.name for p in prune_checkpoints(run_dir, 1)] == ["step_000001", "step_000002"]
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step_000003"]


def test_resuming_a_run_without_a_checkpoint_says_why(tmp_path, counter_env_registered):
    RLTrainer(toy_config(tmp_path, "train.steps=1", "train.save_every=5"), log=lambda _: None).fit()
    for folder in (tmp_path / "toy" / "checkpoints").iterdir():  # as if it stopped before its first save
        for path in sorted(folder.rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        folder.rmdir()
    with pytest.raises(UserError, match="has no checkpoint yet"):
        RLTrainer(toy_config(tmp_path, "train.steps=2"), log=lambda _: None).fit(resume=True)
    # A run that never started is simply started.
    said: list[str] = []
    RLTrainer(toy_config(tmp_path, "run.name=fresh", "train.steps=1"), log=said.append).fit(resume=True)
    assert any("starting it" in line for line in said)


def test_an_unwritable_run_folder_is_reported_before_any_work(tmp_path):
    # A file where the run folder's parent should be: unwritable even for root.
    (tmp_path / "runs").write_text("not a folder")
    result = run("train", str(REPO / "configs" / "babyai_grpo.yaml"), f"run.output_dir={tmp_path / 'runs'}")
    assert result.returncode == 2
    assert "cannot write the run folder" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_nearly_full_disk_is_reported_before_any_work(tmp_path, monkeypatch):
    import shutil

    from agentgym_rl import runs

    monkeypatch.setattr(runs.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9, 5 * 2**20))
    with pytest.raises(UserError, match="only 5 MiB are free on the disk"):
        runs.start_run(tmp_path / "run", toy_config(tmp_path))


def test_steps_that_update_nothing_say_why_and_are_counted(tmp_path, counter_env_registered):
    """A context limit shorter than the first observation ends every episode before the model
    replies: no step has anything to train on, and each says so."""
    said: list[str] = []
    RLTrainer(toy_config(tmp_path, "train.steps=3", "rollout.max_context=8"), log=said.append).fit()
    for step in (1, 2, 3):
        assert f"step {step}: no update: no rollout has a trained token" in "\n".join(said)
    assert said[-1].startswith("3 of 3 steps updated nothing (steps 1, 2, 3)")


@pytest.mark.parametrize("metrics,expected", [
    ({"update/trajectories": 0}, "no rollout has a trained token"),
    ({"update/trajectories": 0, "adv/num_groups": 8.0, "adv/zero_var_group_frac": 1.0},
     "the rewards tie within each of the 8 groups"),
    ({"update/trajectories": 5, "update/skipped_steps": 2.0, "update/optimizer_steps": 2},
     "the algo.max_kl guard skipped all 2 optimizer steps"),
    ({"update/trajectories": 5, "update/skipped_steps": 1.0, "update/optimizer_steps": 2}, None),
])
def test_no_update_reason(metrics, expected):
    reason = no_update_reason(metrics)
    assert reason == expected if expected is None else expected in reason


@pytest.mark.parametrize("recompute", [True, False])
def test_generator_and_learner_logprobs_agree_on_cpu_float32(tmp_path, counter_env_registered, recompute):
    """The generator's logprobs (KV-cached, left-padded batches) and the learner's (one
    right-padded forward) score the same tokens: their gap is logged every step that updates
    and is ~0 here; measured over all kept rows when the learner recomputes old logprobs, over
    the first minibatch otherwise."""
    RLTrainer(toy_config(tmp_path, "train.steps=3", "algo.temperature=0.7", "algo.group_size=4",
                         f"algo.recompute_old_logprobs={str(recompute).lower()}"), log=lambda _: None).fit()
    rows = [json.loads(line) for line in (tmp_path / "toy" / "metrics.jsonl").read_text().splitlines()]
    updated = [r for r in rows if r["update/trajectories"] > 0]
    assert updated, "no step updated: the gap was never measured"
    for row in updated:
        assert 0 <= row["rollout/logprob_gap_mean"] <= row["rollout/logprob_gap_max"] < 1e-4


def test_a_generator_with_its_own_model_copy_is_kept_in_sync(tmp_path, counter_env_registered, monkeypatch):
    """The learner's and the generator's models may be distinct objects (another device, dtype
    or engine): after every update the trainer syncs the generator's copy, so the next step's
    rollouts sample the updated weights and the logprob gap stays ~0 (without the sync it grows
    to the size of the update)."""
    import copy

    import torch

    from agentgym_rl.agent.generator import HFGenerator
    from agentgym_rl.rollout.policy import ModelPolicy
    from agentgym_rl.train.session import Session

    copies, shared_model_policy = [], Session.policy

    def policy_with_own_copy(self, temperature, listed_actions_only=False, model=None):
        policy = shared_model_policy(self, temperature, listed_actions_only)
        model = copy.deepcopy(self.model)
        copies.append(model)
        generator = policy.generator
        return ModelPolicy(HFGenerator(model, generator.pad_id, generator.stop_ids, temperature), policy.encoder)

    monkeypatch.setattr(Session, "policy", policy_with_own_copy)
    trainer = RLTrainer(toy_config(tmp_path, "train.steps=4", "algo.group_size=4", "optim.lr=0.01"),
                        log=lambda _: None)
    trainer.fit()
    rows = [json.loads(line) for line in (tmp_path / "toy" / "metrics.jsonl").read_text().splitlines()]
    assert any(r["update/trajectories"] > 0 for r in rows[:-1]), "no update before the last step"
    assert all(r["rollout/logprob_gap_max"] < 1e-4 for r in rows if "rollout/logprob_gap_max" in r)
    learner = dict(trainer.learner.model.named_parameters())
    for model in copies:
        assert model is not trainer.learner.model
        for name, param in model.named_parameters():
            assert torch.equal(param, learner[name]), name


# ------------------------------------------------------------- damaged runs: no traceback


def test_a_cut_off_metrics_line_is_skipped_by_resume_and_report(tmp_path, counter_env_registered, capsys):
    RLTrainer(toy_config(tmp_path, "train.steps=1"), log=lambda _: None).fit()
    metrics = tmp_path / "toy" / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + '{"step": 2, "train/succ')  # killed mid-write
    RLTrainer(toy_config(tmp_path, "train.steps=2"), log=lambda _: None).fit(resume=True)
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [1, 2]
    assert "ends in an unfinished line" in capsys.readouterr().err
    metrics.write_text(metrics.read_text() + '{"step": 3, "tr')
    result = run("report", str(tmp_path / "toy"))
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "ends in an unfinished line" in result.stderr


def test_a_gzipped_lines_file_reads_as_the_plain_one_and_a_cut_one_is_one_line(tmp_path):
    import gzip

    from agentgym_rl.jsonlines import read_json_lines

    text = '{"step": 1}\n\n{"step": 2, "x": [1, 2]}\n'
    (tmp_path / "a.jsonl").write_text(text)
    whole = gzip.compress(text.encode())
    (tmp_path / "a.jsonl.gz").write_bytes(whole)
    assert read_json_lines(tmp_path / "a.jsonl.gz") == read_json_lines(tmp_path / "a.jsonl") == [
        {"step": 1}, {"step": 2, "x": [1, 2]}]
    (tmp_path / "cut.jsonl.gz").write_bytes(whole[:len(whole) // 2])
    with pytest.raises(UserError, match=r"cut.jsonl.gz: not a whole gzip file \(Compressed file ended"):
        read_json_lines(tmp_path / "cut.jsonl.gz")
    (tmp_path / "plain.jsonl.gz").write_text(text)  # named .gz, never compressed
    with pytest.raises(UserError, match="plain.jsonl.gz: not a whole gzip file .*Not a gzipped file"):
        read_json_lines(tmp_path / "plain.jsonl.gz")


def test_eval_of_a_run_passes_over_a_half_written_checkpoint(tmp_path, counter_env_registered):
    RLTrainer(toy_config(tmp_path, "train.steps=2"), log=lambda _: None).fit()
    weights = tmp_path / "toy" / "checkpoints" / "step_000002" / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:weights.stat().st_size // 2])
    result = run("eval", "--run", str(tmp_path / "toy"), "--episodes", "2", "--max-turns", "2")
    assert result.returncode == 0, result.stderr
    assert "warning: checkpoint" in result.stderr and "step_000002 cannot be loaded" in result.stderr


@pytest.mark.parametrize("damage", ["config.json", "model.safetensors"])
def test_a_model_folder_that_does_not_load_is_one_line_before_any_run_folder(tmp_path, counter_env_registered,
                                                                              damage):
    RLTrainer(toy_config(tmp_path, "train.steps=1"), log=lambda _: None).fit()
    model = tmp_path / "toy" / "checkpoints" / "step_000001" / "model"
    (model / damage).write_bytes(b"{not JSON, nor safetensors")
    result = run("train", str(REPO / "configs" / "babyai_grpo.yaml"), *TOY, f"run.output_dir={tmp_path}",
                 "run.name=from_damaged", f"model.path={model}", "train.steps=1")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and lines[-1].startswith("error: model path") and "does not load" in lines[-1]
    assert "Traceback" not in result.stderr and not (tmp_path / "from_damaged").exists()
    served = run("serve-model", str(model), "--port", "0")
    assert served.returncode == 2 and "does not load" in served.stderr and "Traceback" not in served.stderr


def test_a_full_disk_stops_the_run_with_one_line_and_it_resumes(tmp_path, counter_env_registered, monkeypatch):
    import errno

    from agentgym_rl.train import rl

    written = rl.save_trajectories

    def full_at_step_2(trajectories, path):
        if Path(path).name == "step_000002.jsonl":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return written(trajectories, path)

    monkeypatch.setattr(rl, "save_trajectories", full_at_step_2)
    with pytest.raises(UserError) as caught:
        RLTrainer(toy_config(tmp_path, "train.steps=3"), log=lambda _: None).fit()
    message = str(caught.value)
    assert "No space left on device" in message and "newest checkpoint is step_000001" in message
    assert "--resume" in message and "\n" not in message
    monkeypatch.setattr(rl, "save_trajectories", written)
    RLTrainer(toy_config(tmp_path, "train.steps=3"), log=lambda _: None).fit(resume=True)
    rows = [json.loads(line) for line in (tmp_path / "toy" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]


def test_resuming_on_a_read_only_disk_says_so_and_blames_no_checkpoint(tmp_path, counter_env_registered,
                                                                        monkeypatch):
    import builtins
    import errno
    import io

    RLTrainer(toy_config(tmp_path, "train.steps=1"), log=lambda _: None).fit()
    opened = io.open

    def read_only(file, mode="r", *args, **kwargs):  # root ignores chmod: the disk refuses instead
        if any(flag in mode for flag in "wax+") and str(file).startswith(str(tmp_path)):
            raise OSError(errno.EROFS, "Read-only file system", str(file))
        return opened(file, mode, *args, **kwargs)

    monkeypatch.setattr(io, "open", read_only)
    monkeypatch.setattr(builtins, "open", read_only)
    with pytest.raises(UserError, match=r"cannot resume .*toy'?: its folder cannot be written \(Read-only file "
                                        r"system\)") as caught:
        RLTrainer(toy_config(tmp_path, "train.steps=2"), log=lambda _: None).fit(resume=True)
    assert "checkpoint" not in str(caught.value)


def test_sft_on_an_empty_data_file_says_it_is_empty(tmp_path):
    data = tmp_path / "empty.jsonl"
    data.write_text("")
    result = run("sft", str(REPO / "configs" / "babyai_sft.yaml"), f"data.path={data}", f"run.output_dir={tmp_path}")
    assert result.returncode == 2 and "holds no conversation (it is empty)" in result.stderr, result.stderr


def test_a_full_disk_under_tensorboard_is_one_warning_and_one_error_line(tmp_path, counter_env_registered,
                                                                         monkeypatch, capfd):
    import errno

    from tensorboard.summary.writer.record_writer import RecordWriter

    written = RecordWriter.write

    def full_from_step_1(self, data):  # the disk fills once the run is under way
        if b"train/" in data:
            raise OSError(errno.ENOSPC, "No space left on device")
        return written(self, data)

    monkeypatch.setattr(RecordWriter, "write", full_from_step_1)  # what TensorBoard's writer thread calls
    before = set(threading.enumerate())  # writer threads other tests of this worker left running
    with pytest.raises(UserError, match="No space left on device"):
        RLTrainer(toy_config(tmp_path, "train.steps=2"), log=lambda _: None).fit()
    # The warning comes from this run's TensorBoard writer thread: reading the capture while it
    # still writes can cut the line, so that thread ends first.
    for thread in set(threading.enumerate()) - before:
        if type(thread).__name__ == "_AsyncWriterThread":
            thread.join(timeout=10)
    said = capfd.readouterr().err
    assert "warning: TensorBoard could not write its event file (No space left on device)" in said
    assert "Traceback" not in said


def test_overwrite_starts_a_held_run_folder_afresh_and_never_deletes_the_working_directory(
        tmp_path, counter_env_registered, monkeypatch):
    from types import SimpleNamespace

    from agentgym_rl.runs import start_run

    RLTrainer(toy_config(tmp_path, "train.steps=1"), log=lambda _: None).fit()
    with pytest.raises(UserError, match="already holds a run; use --resume or a new run.name, or --overwrite"):
        RLTrainer(toy_config(tmp_path, "train.steps=1"), log=lambda _: None).fit()
    (tmp_path / "toy" / "stale.txt").write_text("from the run before")
    result = run("train", str(REPO / "configs" / "babyai_grpo.yaml"), *TOY, f"run.output_dir={tmp_path}",
                 "run.name=toy", "train.steps=2", "--overwrite")
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "toy" / "stale.txt").exists()
    rows = [json.loads(line) for line in (tmp_path / "toy" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    both = run("train", str(REPO / "configs" / "babyai_grpo.yaml"), *TOY, f"run.output_dir={tmp_path}",
               "run.name=toy", "--overwrite", "--resume")
    assert both.returncode == 2 and "give one of them" in both.stderr
    monkeypatch.chdir(tmp_path / "toy")
    with pytest.raises(UserError, match="holds the working directory"):
        start_run(Path("."), SimpleNamespace(run=SimpleNamespace(overwrite=True)))
    assert (tmp_path / "toy" / "metrics.jsonl").exists()


def test_eval_of_a_run_keeps_its_memory_setting(tmp_path):
    """`eval --run` of a SmolLM2 run evaluates with the run's `run.malloc_mmap_threshold_kb` (the
    recipe's "auto", which an evaluation resolves to 1 MiB), and with its seed; a run without the key gets the default."""
    from agentgym_rl.config import PlayConfig, from_dict, to_dict
    from agentgym_rl.runs import played_settings

    recipe = load_config(RLConfig, REPO / "configs" / "smollm2_babyai_grpo.yaml", ["run.seed=3"])
    (tmp_path / "smollm2").mkdir()
    (tmp_path / "smollm2" / "config.yaml").write_text(yaml.safe_dump(to_dict(recipe)))
    played = from_dict(PlayConfig, played_settings(tmp_path / "smollm2"))
    assert played.run.malloc_mmap_threshold_kb == recipe.run.malloc_mmap_threshold_kb == "auto"
    assert played.run.seed == 3 and played.rollout.reply_prefix == "Action:"
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "config.yaml").write_text("run: {seed: 1}\nenv: {id: babyai}\n")
    assert from_dict(PlayConfig, played_settings(tmp_path / "plain")).run.malloc_mmap_threshold_kb == 0


def test_gigpo_on_an_environment_without_states_is_refused_unless_allowed(tmp_path):
    """GiGPO's step level groups turns by their true state: on an environment that names none
    (search), or a mix with such a member, it is refused before any work; allowed, it warns."""
    recipe = REPO / "configs" / "babyai_gigpo.yaml"
    for env in (["env.id=search", "env.kwargs={}"],
                ["env.id=mix", "env.kwargs={members: [{id: babyai}, {id: search}]}"]):
        config = load_config(RLConfig, recipe, [*env, f"run.output_dir={tmp_path}"])
        with pytest.raises(UserError, match=r"search names no states .* algo.without_state_keys=true"):
            RLTrainer(config, log=lambda _: None)
    said: list[str] = []
    allowed = load_config(RLConfig, recipe, ["env.id=search", "env.kwargs={}", "algo.without_state_keys=true",
                                             f"run.output_dir={tmp_path}"])
    RLTrainer(allowed, log=said.append)
    assert any(line.startswith("warning: search names no states") for line in said)
    assert not (tmp_path / "babyai_gigpo").exists()


def test_credit_from_what_no_environment_reports_is_refused_and_in_a_mix_warned(tmp_path):
    """Search reports no discoveries and names no states: the discovery bonus would never be
    paid and no turn would count as idle, so the run stops before any work; in a mix with
    BabyAI each applies on BabyAI's episodes, and the run says so. On AgentGym's servers, whose
    protocol sends no step info, BabyAI reports neither (refused before any server is asked)."""
    recipe = REPO / "configs" / "babyai_grpo.yaml"
    for setting, what in (("algo.discovery_bonus=0.5", "search reports nothing discovered .*never be paid"),
                          ("algo.idle_turn_penalty=0.2", "search names no states .*no turn would count as idle")):
        config = load_config(RLConfig, recipe, ["env.id=search", "env.kwargs={}", setting,
                                                f"run.output_dir={tmp_path}"])
        with pytest.raises(UserError, match=rf"{setting.split('=')[0]}: {what}: drop it"):
            RLTrainer(config, log=lambda _: None)
        said: list[str] = []
        mixed = load_config(RLConfig, recipe, ["env.id=mix", "env.kwargs={members: [{id: babyai}, {id: search}]}",
                                               setting, f"run.output_dir={tmp_path}"])
        RLTrainer(mixed, log=said.append)
        assert any(line.startswith(f"warning: {setting.split('=')[0]}: search ") for line in said), said
        served = load_config(RLConfig, recipe, ["env.kwargs={}", "env.urls=[agentgym+http://127.0.0.1:9]", setting,
                                                f"run.output_dir={tmp_path}"])
        with pytest.raises(UserError, match=r"babyai .* on AgentGym's servers, whose protocol sends no step info"):
            RLTrainer(served, log=lambda _: None)
    gigpo = load_config(RLConfig, REPO / "configs" / "babyai_gigpo.yaml",
                        ["env.kwargs={}", "env.urls=[agentgym+http://127.0.0.1:9]", f"run.output_dir={tmp_path}"])
    with pytest.raises(UserError, match=r"babyai names no states .* AgentGym's servers.* algo.without_state_keys"):
        RLTrainer(gigpo, log=lambda _: None)