"""Token-exact chat encoding: what is trained is exactly what was sampled and seen."""

from __future__ import annotations

import pytest
from conftest import CounterEnv, ScriptedGenerator

from agentgym_rl.agent.chat import ChatEncoder
from agentgym_rl.agent.generator import Generation
from agentgym_rl.agent.tiny import train_tokenizer
from agentgym_rl.envs.tasks import Task
from agentgym_rl.errors import UserError
from agentgym_rl.config import RolloutConfig
from agentgym_rl.rollout.engine import RolloutEngine
from agentgym_rl.rollout.policy import ModelPolicy

# Chat templates of two real model families, as their tokenizer_config.json ships them
# (tool-calling branches left out): they differ in markers, default system prompt and trimming.
QWEN25_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or (message.role == 'assistant') %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}"
    "{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


def make_tokenizer(family: str):
    from conftest import CORPUS

    tokenizer = train_tokenizer(CORPUS, vocab_size=400)
    if family == "qwen2.5":
        tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
        tokenizer.eos_token = "<|im_end|>"
        tokenizer.chat_template = QWEN25_TEMPLATE
    elif family == "llama3":
        tokenizer.add_special_tokens({"additional_special_tokens": [
            "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]})
        tokenizer.bos_token = "<|begin_of_text|>"
        tokenizer.eos_token = "<|eot_id|>"
        tokenizer.chat_template = LLAMA3_TEMPLATE
    return tokenizer


REPLIES = ["Thought: I should count.\nAction: count", "Action: look", "Thought: again.\nAction: count"]


def play_scripted(env_class, replies: list[str], item: int = 0, **config):
    """One episode of counter item `item` with the scripted `replies` (a qwen2.5-style tokenizer,
    at most 10 turns, `RolloutConfig(max_new_tokens=32, **config)`): (its trajectory, the tokenizer)."""
    tokenizer = make_tokenizer("qwen2.5")
    encoder = ChatEncoder(tokenizer)
    generator = ScriptedGenerator(tokenizer, replies, encoder.end_of_turn_id)
    engine = RolloutEngine(env_class, RolloutConfig(max_new_tokens=32, **config))
    [trajectory] = engine.run([Task("counter", item, "c")], ModelPolicy(generator, encoder), max_turns=10)
    return trajectory, tokenizer


class LookingCounterEnv(CounterEnv):
    """CounterEnv listing two-word actions, so a reply can go wrong after its first word."""

    def available_actions(self):
        return ["count", "look left", "look right"]


@pytest.mark.parametrize("locate", [True, False])
def test_the_engine_records_where_a_rejected_reply_went_wrong(locate):
    trajectory, tokenizer = play_scripted(LookingCounterEnv, ["Action: jump", "Action: look up", "Action: count"],
                                          locate_wrong_tokens=locate)
    assert trajectory.success and trajectory.invalid_turns == [0, 1]
    if not locate:
        assert trajectory.wrong_tokens == [] and trajectory.right_tokens == []
        return
    jump, _ = trajectory.wrong_tokens
    first_reply = trajectory.loss_mask.index(1)
    assert tokenizer.decode(trajectory.input_ids[first_reply:jump]).strip() == "Action:"
    assert_jump_and_look_up_located(trajectory, tokenizer)


class IdlingCounterEnv(CounterEnv):
    """CounterEnv that accepts "look left": a turn that leaves the state as it was."""

    def step(self, action):
        if "look left" in action:
            return "You look left.", 0.0, False, False, {"success": False, "invalid_action": False,
                                                        "state_key": str(self.count)}
        return super().step(action)


class KindCounterEnv(CounterEnv):
    """CounterEnv whose infos name the kind of action taken, as BabyAI's do."""

    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        return observation, reward, terminated, truncated, {**info, "action_kind": "increment"}


def test_the_engine_records_the_kind_the_environment_names_over_the_first_word():
    trajectory, _ = play_scripted(KindCounterEnv, ["Action: count"], locate_wrong_tokens=True)
    assert trajectory.action_verbs == ["increment"] and len(trajectory.action_tokens) == 1


class DiscoveringCounterEnv(CounterEnv):
    """CounterEnv whose first count shows the agent something new (`info["discovered"]`), as a
    BabyAI turn that brings unseen cells into view does; later counts show nothing new. A
    rejected action claims a discovery too, which the engine must not credit."""

    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        new = info["invalid_action"] or (self.count == 1 and "count" in action)
        return observation, reward, terminated, truncated, {**info, "discovered": 3 if new else 0}


def test_the_engine_records_the_accepted_actions_that_discovered_something():
    trajectory, _ = play_scripted(DiscoveringCounterEnv, ["Action: count", "Action: jump", "Action: count"], item=1,
                                  locate_wrong_tokens=True)
    assert trajectory.success and trajectory.invalid_turns == [1] and len(trajectory.action_tokens) == 2
    assert trajectory.discovery_tokens == trajectory.action_tokens[:1]


@pytest.mark.parametrize("locate", [True, False])
def test_the_engine_records_turns_that_changed_nothing_and_where_their_action_began(locate):
    trajectory, tokenizer = play_scripted(IdlingCounterEnv, ["Thought: where?\nAction: look left", "Action: count"],
                                          locate_wrong_tokens=locate)
    assert trajectory.success and trajectory.state_keys == ["0", "0"]
    assert trajectory.idle_turns == [0] and trajectory.invalid_turns == []
    if not locate:
        assert trajectory.idle_tokens == [] and trajectory.action_tokens == trajectory.action_verbs == []
        return
    [look] = trajectory.idle_tokens
    first_reply = trajectory.loss_mask.index(1)
    assert trajectory.loss_mask[look] == 1
    assert tokenizer.decode(trajectory.input_ids[first_reply:look]).rstrip().endswith("Action:")
    assert tokenizer.decode(trajectory.input_ids[look:look + 1]).strip().startswith("l")
    # The second turn's action reached a new state: its first token and verb are recorded.
    assert trajectory.action_verbs == ["count"]
    [count] = trajectory.action_tokens
    assert count > look and trajectory.loss_mask[count] == 1
    assert tokenizer.decode(trajectory.input_ids[count - 2:count]).rstrip().endswith("Action:")
    assert tokenizer.decode(trajectory.input_ids[count:count + 1]).strip().startswith("c")


def assert_jump_and_look_up_located(trajectory, tokenizer) -> None:
    """The wrong tokens of the replies "jump" then "look up" when "count", "look left" and
    "look right" are listed."""
    jump, look = trajectory.wrong_tokens
    assert trajectory.loss_mask[jump] == 1 and trajectory.loss_mask[look] == 1  # generated tokens only
    # "jump" starts no available action: the token bringing its "j" is wrong. It is the action's
    # first token, so no right tokens are given (which action to take is the outcome's call).
    assert "j" in tokenizer.decode(trajectory.input_ids[jump:jump + 1])
    # "look up" went wrong after "look": in place of the token bringing "up", those starting
    # "left" and "right" would have continued a listed action.
    assert tokenizer.decode(trajectory.input_ids[look - 3:look]).rstrip().endswith("look")
    assert "u" in tokenizer.decode(trajectory.input_ids[look:look + 1])
    assert trajectory.right_tokens[0] == []
    first, second = [tokenizer.decode(i).strip() for i in trajectory.right_tokens[1]]
    assert first and "left".startswith(first) and second and "right".startswith(second)


@pytest.mark.parametrize("family", ["tiny", "qwen2.5", "llama3"])
def test_rollout_ids_equal_template_encoding_of_the_conversation(family):
    tokenizer = make_tokenizer(family)
    encoder = ChatEncoder(tokenizer)
    generator = ScriptedGenerator(tokenizer, REPLIES, encoder.end_of_turn_id)
    engine = RolloutEngine(CounterEnv, RolloutConfig(max_new_tokens=32, system_prompt=True))
    [trajectory] = engine.run([Task("counter", 1, "c")], ModelPolicy(generator, encoder), max_turns=10)

    # The env saw: reset obs, then the three replies' outcomes (count, look, count -> goal 2).
    contents = [m["content"] for m in trajectory.messages]
    assert contents == [CounterEnv.instruction, "Goal: count to 2.", REPLIES[0], "Counter value is 1.",
                        REPLIES[1], "Nothing happens.", REPLIES[2], "Counter value is 2."]
    assert trajectory.success and trajectory.turns == 3 and trajectory.invalid_actions == 1
    assert trajectory.invalid_turns == [1]  # "look", the second reply

    # Ids + the final observation's delta == the template's own encoding of the conversation.
    final_delta = encoder.user_delta(trajectory.messages[:-1], trajectory.messages[-1]["content"])
    rendered = tokenizer.apply_chat_template(trajectory.messages, tokenize=False, add_generation_prompt=True)
    assert trajectory.input_ids + final_delta == tokenizer.encode(rendered, add_special_tokens=False)
    assert tokenizer.decode(trajectory.input_ids + final_delta) == rendered

    # The generator was fed exactly the trajectory's prefixes.
    for prompt in generator.prompts:
        assert trajectory.input_ids[: len(prompt)] == prompt

    # loss_mask is 1 exactly on the generated tokens (reply + end-of-turn), with their logprobs.
    generated = [t for t, m in zip(trajectory.input_ids, trajectory.loss_mask) if m]
    expected = []
    for reply in REPLIES:
        expected += tokenizer.encode(reply, add_special_tokens=False) + [encoder.end_of_turn_id]
    assert generated == expected
    assert all((lp == -1.0) == bool(m) for lp, m in zip(trajectory.logprobs, trajectory.loss_mask))


def test_sampled_ids_are_kept_even_when_not_canonical(tiny_tokenizer):
    """A model may sample a split of a word that re-tokenising would merge: keep its ids."""
    encoder = ChatEncoder(tiny_tokenizer)
    canonical = tiny_tokenizer.encode("count", add_special_tokens=False)
    by_chars = [tiny_tokenizer.convert_tokens_to_ids(c) for c in "count"]
    assert canonical != by_chars  # BPE merged "count"; the split spelling is another id sequence

    class CharGenerator:
        def generate(self, prompts, max_new_tokens, streams=None):
            from agentgym_rl.agent.generator import Generation
            return [Generation(by_chars + [encoder.end_of_turn_id], [-0.5] * 6, True) for _ in prompts]

    engine = RolloutEngine(CounterEnv)
    [trajectory] = engine.run([Task("counter", 0, "c")], ModelPolicy(CharGenerator(), encoder), max_turns=1)
    assert trajectory.messages[-2] == {"role": "assistant", "content": "count"}
    generated = [t for t, m in zip(trajectory.input_ids, trajectory.loss_mask) if m]
    assert generated == by_chars + [encoder.end_of_turn_id]


def test_unfinished_reply_is_closed_with_an_untrained_end_of_turn(tiny_tokenizer):
    encoder = ChatEncoder(tiny_tokenizer)
    generator = ScriptedGenerator(tiny_tokenizer, ["Action: count"], encoder.end_of_turn_id, finish=False)
    engine = RolloutEngine(CounterEnv, RolloutConfig(system_prompt=True))
    [trajectory] = engine.run([Task("counter", 2, "c")], ModelPolicy(generator, encoder), max_turns=1)
    reply_ids = tiny_tokenizer.encode("Action: count", add_special_tokens=False)
    start = len(encoder.start(trajectory.messages[:2]))
    assert trajectory.input_ids[start:start + len(reply_ids) + 1] == reply_ids + [encoder.end_of_turn_id]
    assert trajectory.loss_mask[start:start + len(reply_ids) + 1] == [1] * len(reply_ids) + [0]


def test_encode_conversation_matches_rollout_layout(tiny_tokenizer):
    encoder = ChatEncoder(tiny_tokenizer)
    generator = ScriptedGenerator(tiny_tokenizer, REPLIES, encoder.end_of_turn_id)
    [trajectory] = RolloutEngine(CounterEnv).run([Task("counter", 1, "c")], ModelPolicy(generator, encoder), max_turns=10)
    ids, mask = encoder.encode_conversation(trajectory.messages)
    assert ids == trajectory.input_ids and mask == trajectory.loss_mask


@pytest.mark.parametrize(("family", "wrong_eos", "end"), [("qwen2.5", "<|im_start|>", "<|im_end|>"),
                                                       ("llama3", "<|begin_of_text|>", "<|eot_id|>")])
def test_the_end_of_turn_comes_from_the_template_when_eos_names_another_token(family, wrong_eos, end):
    # transformers 5.17 converts SmolLM2's GGUF with eos "<|im_start|>" (seen on the GPU check);
    # Llama-3 ends its text with one token and its turns with another.
    tokenizer = make_tokenizer(family)
    tokenizer.eos_token = wrong_eos
    encoder = ChatEncoder(tokenizer)
    assert encoder.end_of_turn == end
    assert encoder.end_of_turn_id == tokenizer.convert_tokens_to_ids(end)
    history = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert tokenizer.decode(encoder.user_delta(history, "c")).lstrip().startswith(("<|im_start|>user", "<|start_header"))


def test_the_end_of_turn_may_be_an_added_token_the_tokenizer_does_not_call_special():
    # As transformers 5.17 leaves SmolLM2's GGUF tokenizer: only bos/eos/unk are special.
    from conftest import CORPUS

    tokenizer = train_tokenizer(CORPUS, vocab_size=400)
    tokenizer.add_tokens(["<|im_start|>", "<|im_end|>"])
    tokenizer.eos_token = "<|im_start|>"
    tokenizer.chat_template = QWEN25_TEMPLATE
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") not in tokenizer.all_special_ids
    assert ChatEncoder(tokenizer).end_of_turn == "<|im_end|>"


def test_template_without_the_end_of_turn_marker_is_a_user_error(tiny_tokenizer):
    from agentgym_rl.errors import UserError

    encoder = ChatEncoder(tiny_tokenizer, end_of_turn="<|user|>")
    with pytest.raises(UserError, match="does not end assistant turns"):
        encoder.user_delta([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "c")


def test_a_reply_prefix_is_context_the_model_continues_and_part_of_the_replys_text():
    """With rollout.reply_prefix "Action:" the model is prompted with the prefix after the
    generation prompt, replies " count", and the environment gets "Action: count"; the prefix's
    ids stand in the trajectory untrained, and the ids still equal the template's encoding."""
    tokenizer = make_tokenizer("qwen2.5")
    encoder = ChatEncoder(tokenizer)
    generator = ScriptedGenerator(tokenizer, [" jump", " count"], encoder.end_of_turn_id)
    engine = RolloutEngine(CounterEnv, RolloutConfig(max_new_tokens=32, reply_prefix="Action:"))
    [trajectory] = engine.run([Task("counter", 0, "c")], ModelPolicy(generator, encoder), max_turns=10)
    assert [m["content"] for m in trajectory.messages if m["role"] == "assistant"] == ["Action: jump", "Action: count"]
    assert trajectory.success and trajectory.invalid_turns == [0]
    prefix = encoder.encode_text("Action:")
    assert generator.prompts[0][-len(prefix):] == prefix  # the model continues from the prefix
    trained = tokenizer.decode([i for i, m in zip(trajectory.input_ids, trajectory.loss_mask) if m])
    assert "Action" not in trained and "jump" in trained and "count" in trained
    ids, _ = encoder.encode_conversation(trajectory.messages)
    assert trajectory.input_ids == ids


def test_a_rejected_reply_is_located_after_the_reply_prefix():
    """With "Action:" as context, the model generates " look up": the wrong token is the one
    bringing "up" among the generated ids (the prefix is untrained and never blamed), and the
    tokens starting "left" and "right" would have continued a listed action."""
    trajectory, tokenizer = play_scripted(LookingCounterEnv, [" jump", " look up", " count"], reply_prefix="Action:",
                                          locate_wrong_tokens=True)
    assert trajectory.success and trajectory.invalid_turns == [0, 1]
    assert_jump_and_look_up_located(trajectory, tokenizer)


class ExpertCounterEnv(CounterEnv):
    """The counter game with an expert the environment answers for (`TextEnv.expert_action`)."""

    asked = 0  # expert replies given, by all instances

    def expert_action(self):
        ExpertCounterEnv.asked += 1
        return "Thought: count.\nAction: count"


def test_a_worked_example_opens_every_conversation_as_untrained_context():
    """rollout.example "counter_2" (goal 3) with example_turns 2: each episode opens with the
    expert's first two turns on that item (its observations and ReAct replies), then its own
    first observation. The example's replies are marked not to be trained and none of their
    tokens are; the ids equal the template's encoding of the whole conversation, and the model
    was prompted with the example. A second run reuses the example without replaying it."""
    tokenizer = make_tokenizer("qwen2.5")
    encoder = ChatEncoder(tokenizer)
    generator = ScriptedGenerator(tokenizer, ["count"], encoder.end_of_turn_id)
    engine = RolloutEngine(ExpertCounterEnv, RolloutConfig(max_new_tokens=32, example="counter_2", example_turns=2))
    tasks = [Task("counter", 0, "c"), Task("counter", 1, "c")]
    first = engine.run(tasks, ModelPolicy(generator, encoder), max_turns=5)
    expert = "Thought: count.\nAction: count"
    assert first[0].messages[:5] == [
        {"role": "user", "content": "Goal: count to 3."}, {"role": "assistant", "content": expert, "loss": False},
        {"role": "user", "content": "Counter value is 1."}, {"role": "assistant", "content": expert, "loss": False},
        {"role": "user", "content": "Goal: count to 1."}]
    assert first[1].messages[4] == {"role": "user", "content": "Goal: count to 2."}
    for trajectory in first:
        assert trajectory.success and trajectory.invalid_actions == 0
        trained = tokenizer.decode([i for i, m in zip(trajectory.input_ids, trajectory.loss_mask) if m])
        assert "Thought" not in trained and "count" in trained
        assert trajectory.input_ids == encoder.encode_conversation(trajectory.messages)[0]
    assert tokenizer.decode(generator.prompts[0]).count(expert) == 2
    asked = ExpertCounterEnv.asked
    second = engine.run(tasks[:1], ModelPolicy(generator, encoder), max_turns=5)
    assert second[0].messages[:5] == first[0].messages[:5] and ExpertCounterEnv.asked == asked


def test_several_worked_examples_open_the_conversation_one_after_another():
    """rollout.example [counter_2, counter_0] with example_turns 2: counter_2's first two
    expert turns (its goal is 3), then counter_0's one turn (goal 1: the episode ends), then
    the episode's own first observation; no reply of the examples is trained."""
    tokenizer = make_tokenizer("qwen2.5")
    encoder = ChatEncoder(tokenizer)
    generator = ScriptedGenerator(tokenizer, ["count"], encoder.end_of_turn_id)
    config = RolloutConfig(max_new_tokens=32, example=["counter_2", "counter_0"], example_turns=2)
    [trajectory] = RolloutEngine(ExpertCounterEnv, config).run(
        [Task("counter", 1, "c")], ModelPolicy(generator, encoder), max_turns=5)
    expert = {"role": "assistant", "content": "Thought: count.\nAction: count", "loss": False}
    assert trajectory.messages[:7] == [
        {"role": "user", "content": "Goal: count to 3."}, expert, {"role": "user", "content": "Counter value is 1."},
        expert, {"role": "user", "content": "Goal: count to 1."}, expert, {"role": "user", "content": "Goal: count to 2."}]
    assert trajectory.success
    trained = tokenizer.decode([i for i, m in zip(trajectory.input_ids, trajectory.loss_mask) if m])
    assert "Thought" not in trained


def test_a_worked_example_needs_a_training_item_an_expert_and_an_item_that_exists():
    """A test item is refused (the evaluation would show the answer to one of its items), in a
    mix of environments too, as are an environment without an expert and an item the
    environment does not have; the errors name rollout.example. A BabyAI training item plays
    its expert's ReAct turns."""
    from agentgym_rl.envs import registry

    class TurnLeft:
        def act(self, env):
            return "turn left"

    def play(make_env, example):
        engine = RolloutEngine(make_env, RolloutConfig(example=example, example_turns=3))
        return engine.run([Task("babyai", 0, "GoTo")], TurnLeft(), max_turns=1)[0]

    babyai = lambda: registry.make("babyai")  # noqa: E731
    mix = lambda: registry.make("mix", members=[{"id": "babyai"}, {"id": "textcraft"}])  # noqa: E731
    for make_env in (babyai, mix):  # a mix refuses its members' test items
        with pytest.raises(UserError, match="'babyai_0' is a test item"):
            play(make_env, "babyai_0")
    with pytest.raises(UserError, match="'babyai_0' is a test item"):  # wherever it stands in a list
        play(babyai, ["babyai_91", "babyai_0"])
    with pytest.raises(UserError, match="rollout.example 'babyai_x'"):
        play(babyai, "babyai_x")
    with pytest.raises(UserError, match="needs an expert"):
        play(CounterEnv, "counter_1")
    messages = play(babyai, "babyai_91").messages
    replies = [m["content"] for m in messages if m["role"] == "assistant"]
    assert replies[:2] == ["Thought: I need to turn right to explore.\nAction: turn right",
                           "Thought: I need to go to the grey ball.\nAction: go to grey ball 1"]
    assert len(replies) == 3 and replies[2] == "turn left"  # the expert solved babyai_91 in two turns
    assert messages[0]["content"].startswith("Your goal: go to the grey ball")


class NewlineStoppingGenerator(ScriptedGenerator):
    """Replies that a `rollout.stop_strings` token ended: " count\\n" without the end-of-turn
    token, `finished` because a stop id ended them."""

    def generate(self, prompts, max_new_tokens, streams=None):
        replies = super().generate(prompts, max_new_tokens, streams)
        return [Generation(g.ids[:-1], g.logprobs[:-1], True) for g in replies]


def test_a_reply_ended_by_a_stop_string_is_trained_to_its_stop_token_and_closed_untrained():
    tokenizer = make_tokenizer("qwen2.5")
    encoder = ChatEncoder(tokenizer)
    generator = NewlineStoppingGenerator(tokenizer, [" jump\n", " count\n"], encoder.end_of_turn_id)
    engine = RolloutEngine(CounterEnv, RolloutConfig(max_new_tokens=32, reply_prefix="Action:", stop_strings=["\n"]))
    [trajectory] = engine.run([Task("counter", 0, "c")], ModelPolicy(generator, encoder), max_turns=10)
    assert [m["content"] for m in trajectory.messages if m["role"] == "assistant"] == ["Action: jump\n",
                                                                                        "Action: count\n"]
    assert trajectory.success and trajectory.invalid_turns == [0]
    ids, _ = encoder.encode_conversation(trajectory.messages)
    assert trajectory.input_ids == ids  # each turn closed with the end-of-turn token, as the template does
    closings = [i for i, t in enumerate(trajectory.input_ids) if t == encoder.end_of_turn_id
                and i > 0 and tokenizer.decode([trajectory.input_ids[i - 1]]).endswith("\n")
                and trajectory.loss_mask[i - 1] == 1]
    assert len(closings) == 2 and all(trajectory.loss_mask[i] == 0 for i in closings)
