"""Context management for long episodes.

- `rollout.max_observation_tokens`: every observation after the first is cut to a token budget,
  the model sees and is trained on the cut text, and the episode stays one token-exact sequence,
  shorter than without the budget.
- `rollout.keep_turns` (and `window_turns`): the prompt shows the opening and the last turns
  only; the episode is kept as its context windows back to back, and each reply is scored by
  the learner on exactly the window the model wrote it in.
- `rollout.summarize`: before each cut the policy summarizes its window, a reply trained where it
  was written, and the summary stands in the next windows' opening for the turns left out."""

from __future__ import annotations

import pytest
from conftest import CORPUS
from test_model_server import TINY

from agentgym_rl.agent.chat import ChatEncoder
from agentgym_rl.agent.loading import load_model_and_tokenizer
from agentgym_rl.agent.tiny import build_tiny
from agentgym_rl.config import RolloutConfig
from agentgym_rl.eval.evaluate import evaluate


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny(CORPUS * 3, tmp_path_factory.mktemp("context") / "model", TINY)


def test_observations_are_cut_to_the_budget_and_the_episode_stays_token_exact(model_dir):
    _, tokenizer = load_model_and_tokenizer(model_dir)
    encoder = ChatEncoder(tokenizer)
    settings = dict(split="test", episodes=3, max_turns=5, temperature=0.0, progress=False,
                    env_kwargs={"list_actions": True})
    _, whole = evaluate("babyai", str(model_dir), rollout=RolloutConfig(max_new_tokens=12), **settings)
    _, cut = evaluate("babyai", str(model_dir), rollout=RolloutConfig(max_new_tokens=12, max_observation_tokens=24),
                      **settings)
    assert all(t.turns > 1 for t in cut)  # long enough for later observations
    for trajectory in cut:
        users = [m["content"] for m in trajectory.messages if m["role"] == "user"]
        for text in users[1:]:
            if text.endswith("tokens cut]"):
                kept = text[: text.rindex(" [... ")]
                assert len(encoder.encode_text(kept)) <= 24 + 1  # decoding then encoding may merge one token
            else:
                assert len(encoder.encode_text(text)) <= 24
        assert any(text.endswith("tokens cut]") for text in users[1:])
        assert trajectory.input_ids == encoder.encode_conversation(trajectory.messages)[0]
    assert sum(len(t.input_ids) for t in cut) < sum(len(t.input_ids) for t in whole)
    first = [next(m["content"] for m in t.messages if m["role"] == "user") for t in (whole[0], cut[0])]
    assert first[0] == first[1] and not first[1].endswith("cut]")  # the task's first observation stays whole


def _trained_per_window(turns: int, keep: int, most: int) -> list[int]:
    """The replies each window trains, by the rule: a window showing more than `most` earlier
    turns when the episode goes on is cut back to `keep`."""
    counts, shown, current = [], 0, 0
    for turn in range(turns):
        current, shown = current + 1, shown + 1
        if turn < turns - 1 and shown > most:
            counts.append(current)
            current, shown = 0, keep
    return [*counts, current]


def _note(hidden: int, summary: str | None = None) -> str:
    said = f". Your summary of them: {summary.strip()}" if summary and summary.strip() else ""
    return f"\n\n[{hidden} earlier turn{'s' * (hidden != 1)} {'are' if hidden != 1 else 'is'} not shown{said}]"


@pytest.mark.parametrize("keep, window, summarize", [(1, 0, False), (2, 3, False), (1, 2, True)])
def test_kept_turns_make_windows_that_hold_exactly_what_the_model_saw(model_dir, keep, window, summarize):
    """Greedy BabyAI episodes of 8 turns with the context cut: each window is the conversation
    the model was shown, encoded from the messages by hand (the first observation with a note of
    the turns not shown, then the kept turns as context, then the replies written in it, trained);
    the learner's logprobs of every reply, scored over the collated windows, equal the sampler's.
    Scored as one sequence instead (the windows attending to each other), they do not."""
    import torch

    from agentgym_rl.train.batch import collate
    from agentgym_rl.train.learner import token_outputs

    model, tokenizer = load_model_and_tokenizer(model_dir)
    encoder = ChatEncoder(tokenizer)
    rollout = RolloutConfig(max_new_tokens=8, keep_turns=keep, window_turns=window, summarize=summarize,
                            summary_tokens=6)
    _, played = evaluate("babyai", str(model_dir), split="test", episodes=3, max_turns=8, temperature=0.0,
                         progress=False, env_kwargs={"list_actions": True}, rollout=rollout)
    assert all(t.turns == 8 for t in played)  # long enough for several cuts
    for trajectory in played:
        trained = _trained_per_window(trajectory.turns, keep, window or keep)
        assert len(trajectory.windows()) == len(trained) > 1
        messages, first = trajectory.messages, 0  # the first reply each window trains
        for number, ((start, end), count) in enumerate(zip(trajectory.windows(), trained)):
            shown_from = first - keep if number else 0
            opening = dict(messages[0])
            if number:
                summary = trajectory.summaries[number - 1]["text"] if summarize else None
                opening["content"] += _note(shown_from, summary)
            shown = [opening, *messages[1 + 2 * shown_from:2 + 2 * (first + count - 1)]]
            flags = [False] + [m["role"] == "assistant" and index >= 2 * (first - shown_from)
                               for index, m in enumerate(shown[1:], start=1)]
            if summarize and number < len(trained) - 1:  # the window ends with its summary, trained
                assert trajectory.summaries[number]["turns"] == first + count
                shown += [{"role": "user", "content": rollout.summary_prompt},
                          {"role": "assistant", "content": trajectory.summaries[number]["text"]}]
                flags += [False, True]
                count += 1  # a reply of its own
            ids, mask = encoder.encode_conversation(shown, flags)
            assert trajectory.input_ids[start:end] == ids
            # A reply cut at max_new_tokens gets its end-of-turn token as untrained context.
            assert all(have == want or (want and token == encoder.end_of_turn_id)
                       for have, want, token in zip(trajectory.loss_mask[start:end], mask, ids))
            assert sum(trajectory.loss_mask[start:end]) > sum(mask) - count - 1
            first += count - (summarize and number < len(trained) - 1)
    assert len(trajectory.summaries) == (len(trained) - 1 if summarize else 0)
    batch = collate(played, tokenizer.pad_token_id)
    scored = token_outputs(model, batch).logprobs  # each window a row of its own
    on = batch.loss_mask > 0
    assert torch.allclose(scored[on], batch.old_logprobs[on], atol=1e-5)
    masked = token_outputs(model, batch, chunk=None).logprobs  # the model's own forward, as a sharded model runs
    assert torch.allclose(masked[on], batch.old_logprobs[on], atol=1e-5)  # under a block-causal mask
    batch.window_ids = batch.position_ids = None  # the mutant: the windows as one sequence
    later = on & (torch.arange(on.shape[1]) >= min(t.window_starts[0] for t in played))
    mutant = token_outputs(model, batch).logprobs
    # This small model's replies hang little on their context: 5e-7 scored right, 4e-4 as one sequence.
    assert (mutant[later] - batch.old_logprobs[later]).abs().max() > 1e-4


def test_windows_are_documents_when_collated_or_packed_by_hand():
    """An episode of windows [0, 3) and [3, 5) beside one of a single window: `collate` numbers
    each row's windows 1, 2, ... with positions restarting; packing makes each window a document."""
    from agentgym_rl.rollout.trajectory import Trajectory
    from agentgym_rl.train.batch import collate
    from agentgym_rl.train.packing import collate_packed

    cut = Trajectory("e", "e_0", "c", input_ids=[5, 6, 7, 5, 8], loss_mask=[0, 0, 1, 0, 1],
                     logprobs=[0.0, 0.0, -1.0, 0.0, -2.0], window_starts=[3])
    whole = Trajectory("e", "e_1", "c", input_ids=[5, 6, 7], loss_mask=[0, 0, 1], logprobs=[0.0, 0.0, -1.0])
    assert cut.windows() == [(0, 3), (3, 5)] and whole.windows() == [(0, 3)]
    batch = collate([cut, whole], pad_id=0)
    assert batch.window_ids.tolist() == [[1, 1, 1, 2, 2], [1, 1, 1, 0, 0]] and batch.segment_ids is None
    assert batch.position_ids.tolist() == [[0, 1, 2, 0, 1], [0, 1, 2, 0, 0]]
    assert collate([whole], pad_id=0).window_ids is None  # no window cut: the plain padded batch
    packed = collate_packed([[whole, cut]], pad_id=0)
    assert packed.segment_ids.tolist() == [[1, 1, 1, 2, 2, 2, 3, 3]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 0, 1, 2, 0, 1]]


def test_kept_turns_play_past_a_context_the_whole_conversation_would_overflow(model_dir):
    settings = dict(split="test", episodes=2, max_turns=8, temperature=0.0, progress=False,
                    env_kwargs={"list_actions": True})
    _, whole = evaluate("babyai", str(model_dir), rollout=RolloutConfig(max_new_tokens=8, max_context=1500),
                        **settings)
    _, kept = evaluate("babyai", str(model_dir),
                       rollout=RolloutConfig(max_new_tokens=8, max_context=1500, keep_turns=1), **settings)
    assert all(t.truncated and t.turns < 8 for t in whole)  # the context filled up
    assert all(t.turns == 8 for t in kept)
    assert max(end - start for t in kept for start, end in t.windows()) <= 1500


def test_a_grpo_step_trains_on_windows_and_summaries_through_the_cli(tmp_path):
    import json

    from test_cli import run
    from test_train_e2e import train

    from agentgym_rl.rollout.trajectory import load_trajectories

    context = ["rollout.keep_turns=1", "rollout.summarize=true", "rollout.summary_tokens=4"]
    run_dir = train(tmp_path, "kept", "warmup.episodes=0", "train.steps=1", "schedule.horizons=[4]",
                    "train.save_trajectories=true", *context, "env.kwargs.list_actions=true",
                    "algo.group_size=2", "env.reward=reward_fns:reply_chars")  # rewards that differ
    played = load_trajectories(run_dir / "trajectories" / "step_000001.jsonl")
    assert any(len(t.windows()) > 1 for t in played)
    assert all(len(t.windows()) == max(1, t.turns - 1) for t in played)  # a cut after every turn past the second
    assert all(len(t.summaries) == len(t.windows()) - 1 for t in played)
    assert all(len(t.replies()) == t.turns + len(t.summaries) for t in played)  # each summary trained
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    update = next(row for row in rows if "update/loss" in row)
    assert update["update/trajectories"] == len(played) and update["update/grad_norm"] > 0
    assert update["rollout/windows_mean"] == sum(len(t.windows()) for t in played) / len(played)
    assert update["rollout/longest_window"] == max(end - start for t in played for start, end in t.windows())
    assert update["rollout/summaries"] == sum(len(t.summaries) for t in played) > 0
    refused = run("train", "configs/babyai_gigpo.yaml", *context, "--smoke")
    assert refused.returncode == 2
    assert "rollout.summarize trains each summary as a reply of its own, which algo.name: gigpo" in refused.stderr


def test_a_text_policy_is_shown_the_opening_and_the_kept_turns():
    """A chat API's model reads the conversation: with `keep_turns` 2 and `window_turns` 3 it
    is shown the first observation and 0, 1, 2, 3, then 2, 3, 2, 3 ... earlier turns."""
    from agentgym_rl.envs import registry
    from agentgym_rl.rollout.engine import RolloutEngine
    from agentgym_rl.rollout.policy import TextPolicy

    class Recording(TextPolicy):
        def __init__(self):
            self.shown = []

        def act(self, envs, prompts, max_new_tokens, conversations=None, streams=None):
            self.shown += [[dict(m) for m in c] for c in conversations]
            return super().act(envs, prompts, max_new_tokens, conversations, streams)

        def reply(self, env):
            return "Action: turn left"  # never ends an episode

    policy = Recording()
    config = RolloutConfig(keep_turns=2, window_turns=3, max_envs=1)
    with RolloutEngine(registry.env_factory("babyai"), config) as engine:
        [played] = engine.run(registry.tasks("babyai", "test")[:1], policy, max_turns=9)
    assert played.turns == 9
    messages = played.messages
    assert [(len(shown) - 1) // 2 for shown in policy.shown] == [0, 1, 2, 3, 2, 3, 2, 3, 2]
    for turn, shown in enumerate(policy.shown):
        hidden = turn - (len(shown) - 1) // 2
        note = "" if not hidden else f"\n\n[{hidden} earlier turns are not shown]"
        assert shown[0] == {**messages[0], "content": messages[0]["content"] + note}
        assert shown[1:] == messages[1 + 2 * hidden:1 + 2 * turn]


def test_a_text_policys_summary_stands_in_for_the_turns_left_out():
    """With `summarize`, keep 1 and window 2: after turns 3 and 5 the policy is asked for a
    summary of the window it was shown, and the next windows open with it."""
    from agentgym_rl.envs import registry
    from agentgym_rl.rollout.engine import RolloutEngine
    from agentgym_rl.rollout.policy import Reply, TextPolicy

    config = RolloutConfig(keep_turns=1, window_turns=2, summarize=True, max_envs=1)

    class Summarizing(TextPolicy):
        writes_summaries = True  # it reads the conversation, as a chat API's model does

        def __init__(self):
            self.shown = []

        def act(self, envs, prompts, max_new_tokens, conversations=None, streams=None):
            [conversation] = conversations
            self.shown.append([dict(m) for m in conversation])
            if conversation[-1]["content"] == config.summary_prompt:
                return [Reply(f" summary {len(self.shown)} ")]
            return super().act(envs, prompts, max_new_tokens, conversations, streams)

        def reply(self, env):
            return "Action: turn left"

    policy = Summarizing()
    with RolloutEngine(registry.env_factory("babyai"), config) as engine:
        [played] = engine.run(registry.tasks("babyai", "test")[:1], policy, max_turns=7)
    messages = played.messages
    assert played.turns == 7 and played.window_starts == []  # a text policy's episode has no token ids
    assert played.summaries == [{"turns": 3, "text": " summary 4 "}, {"turns": 5, "text": " summary 7 "}]
    first = messages[0]["content"]
    request = {"role": "user", "content": config.summary_prompt}
    assert policy.shown[3] == [*messages[:6], request]  # asked with the window it was shown
    assert policy.shown[4] == [{**messages[0], "content": first + _note(2, "summary 4")}, *messages[5:7]]
    assert policy.shown[6] == [{**messages[0], "content": first + _note(2, "summary 4")}, *messages[5:10], request]
    assert policy.shown[7] == [{**messages[0], "content": first + _note(4, "summary 7")}, *messages[9:11]]

    class Turning(TextPolicy):  # reads the environment, not the conversation, as an expert does
        def reply(self, env):
            return "Action: turn left"

    with RolloutEngine(registry.env_factory("babyai"), config) as engine:
        [scripted] = engine.run(registry.tasks("babyai", "test")[:1], Turning(), max_turns=7)
    assert scripted.turns == 7 and scripted.summaries == []
