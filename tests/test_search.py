"""Deep Search: answer scoring, reply parsing, the generated world and its questions (the hops
are needed: one search answers single-hop questions and almost no multi-hop one), the
expert, and the env's contract."""

from __future__ import annotations

from collections import Counter

import pytest

from agentgym_rl.config import RolloutConfig
from agentgym_rl.envs import registry
from agentgym_rl.envs.base import EnvExpert
from agentgym_rl.envs.checker import check_env
from agentgym_rl.envs.search.answers import exact_match, f1_score, normalize_answer
from agentgym_rl.envs.search.env import NO_TAG, SearchEnv, format_documents, parse_reply
from agentgym_rl.envs.search.expert import read_fact
from agentgym_rl.envs.search.retrieval import BM25Retriever, Doc
from agentgym_rl.envs.search.world import CATEGORIES, build_world
from agentgym_rl.rollout.engine import RolloutEngine


def test_answers_are_normalised_before_matching():
    assert normalize_answer("  The  Eiffel-Tower! ") == "eiffeltower"
    assert normalize_answer("An apple, a day") == "apple day"
    assert exact_match("the Ospaxport.", "Ospaxport") and not exact_match("Ospax port", "Ospaxport")
    assert exact_match("18", ["17", "18"])
    # "red big ball" against "big red ball": 3 common tokens of 3 -> P = R = 1; against "red
    # ball": 2 common, P = 2/3, R = 1, F1 = 2 * (2/3) / (5/3) = 0.8.
    assert f1_score("red big ball", "big red ball") == 1.0
    assert f1_score("red big ball", "red ball") == pytest.approx(0.8)
    assert f1_score("", "x") == 0.0 and f1_score("the", "a") == 0.0


@pytest.mark.parametrize("reply, parsed", [
    ("<think>hm</think>\n<search> Ada  Lovel </search>", ("search", "Ada Lovel")),
    ("<search>x</search> then <answer>Paris</answer>", ("answer", "Paris")),  # the last tag counts
    ("<ANSWER>Paris</ANSWER>", ("answer", "Paris")),
    ("<think>so</think><search>Ada Lovel", ("search", "Ada Lovel")),  # stopped at the closing tag
    ("<search>   </search>", None),
    ("Action: search Ada", None),
    ("", None),
    ("<answer>Pa\x00ris\udcff</answer>", ("answer", "Paris?")),
])
def test_a_reply_gives_its_last_tag(reply, parsed):
    assert parse_reply(reply) == parsed


def test_documents_are_laid_out_as_search_r1_does():
    docs = [Doc("1", "A", "a text."), Doc("7", "B", "b text.")]
    assert format_documents(docs) == "<information>Doc 1(Title: A) a text.\nDoc 2(Title: B) b text.</information>"
    assert "No document" in format_documents([])


def test_bm25_finds_a_name_and_nothing_for_stopwords():
    retriever = BM25Retriever([Doc("0", "Vapax Nopax", "Vapax Nopax was born in Tygor."),
                               Doc("1", "Tygor", "Tygor is a city in Kelmark."),
                               Doc("2", "Harfi Vapax", "Harfi Vapax works for Wynhar Guild.")])
    [found, nothing] = retriever.search(["Where was Vapax Nopax born?", "the of a"], k=2)
    assert [d.title for d in found] == ["Vapax Nopax", "Harfi Vapax"] and nothing == []
    assert found[0].score > found[1].score > 0
    [[only]] = retriever.search(["Kelmark"], k=3)  # one document shares a word: one result, not k
    assert only.title == "Tygor"
    with pytest.raises(ValueError):
        BM25Retriever([])


def test_the_world_is_the_same_for_a_seed_and_its_facts_are_in_its_articles():
    world, again, other = build_world(200, seed=3, questions=50), build_world(200, seed=3, questions=50), \
        build_world(200, seed=4, questions=50)
    assert world.articles == again.articles and world.questions == again.questions
    assert world.articles != other.articles
    assert len({a.title for a in world.articles}) == len(world.articles)  # one article per entity
    docs = [Doc(a.id, a.title, a.text) for a in world.articles]
    for question in world.questions:  # every hop's fact reads from its subject's article
        subject, relation = question.hops[0]
        assert read_fact(docs, subject, relation) == world.fact(subject, relation)
    assert Counter(q.category for q in world.questions) == {category: 10 for category in CATEGORIES}
    with pytest.raises(ValueError):
        build_world(10)


def test_one_search_answers_single_hop_questions_and_almost_no_multi_hop_one():
    """An oracle that answers right whenever the answer is anywhere in what one search for the
    question's own words returned: an upper bound on any one-search policy. It gets every
    single-hop question, and at most 10% of the multi-hop ones (the hops are needed); and no
    answer is in its question."""
    env = SearchEnv()
    found, total = Counter(), Counter()
    for task in registry.tasks("search", "test"):
        question = env.questions[task.index]
        docs = env.retriever.search([question.question], env.top_k)[0]
        seen = " " + normalize_answer(" ".join(f"{d.title} {d.text}" for d in docs)) + " "
        found[question.category] += f" {normalize_answer(question.answer)} " in seen
        total[question.category] += 1
        assert f" {normalize_answer(question.answer)} " not in f" {normalize_answer(question.question)} "
    assert found["1-hop"] == total["1-hop"] == 100
    multi = [c for c in CATEGORIES if c != "1-hop"]
    assert sum(found[c] for c in multi) <= 0.10 * sum(total[c] for c in multi)


def test_the_expert_answers_the_test_split_with_real_searches():
    tasks = registry.tasks("search", "test")
    with RolloutEngine(registry.env_factory("search"), RolloutConfig()) as engine:
        trajectories = engine.run(tasks, EnvExpert(), max_turns=registry.spec("search").max_turns)
    assert sum(t.success for t in trajectories) >= 0.99 * len(tasks)
    by_category = {t.category: t.turns for t in trajectories if t.success}
    assert by_category == {"1-hop": 2, "2-hop": 3, "comparison": 3, "3-hop": 4, "4-hop": 5}


def test_the_env_answers_every_kind_of_reply():
    env = SearchEnv(top_k=2)
    check_env(SearchEnv(), item_id=3, actions=["<search>Vapax</search>", "<answer>nobody</answer>"])
    observation, info = env.reset(1)
    assert observation.startswith("Question: In which country") and info["category"] == "2-hop"
    assert env.step("I think it is Paris") == (NO_TAG, 0.0, False, False, {**info, "success": False,
                                                                           "invalid_action": True})
    documents, reward, done, _, _ = env.step("<search>" + env.question.hops[0][0] + "</search>")
    assert documents.count("Doc ") == 2 and reward == 0.0 and not done
    wrong = env.step("<answer>Nowhere</answer>")
    assert "not correct" in wrong[0] and wrong[1:3] == (0.0, False) and wrong[4]["f1"] == 0.0
    right = env.step(f"<answer>{env.question.answer}</answer>")
    assert right[1:3] == (1.0, True) and right[4]["success"] and right[4]["f1"] == 1.0
    with pytest.raises(ValueError):
        env.reset(10**6)
    with pytest.raises(ValueError):
        SearchEnv(top_k=0)


def test_a_snapshot_carries_the_question_and_what_was_found():
    env = SearchEnv()
    env.reset(3)
    env.step(env.expert_action())
    state, next_reply = env.snapshot(), env.expert_action()  # the second hop's search needs the first's documents
    fork = SearchEnv()
    fork.restore(state)
    assert fork.question == env.question and fork.expert_action() == next_reply
    assert fork.step(next_reply) == env.step(next_reply)
    env.reset(5)
    env.restore(state)
    assert env.question == fork.question and len(env.found) == 1


def test_bad_output_is_feedback_never_an_exception():
    from test_bad_output import BAD

    env = SearchEnv()
    for name, reply in {**BAD, "100 KB in a tag": "<search>" + "Vapax " * 20_000 + "</search>",
                        "surrogates in a tag": "<answer>\udcff\ud800</answer>"}.items():
        env.reset(3)
        observation, reward, terminated, _, info = env.step(reply)
        assert reward == 0 and not terminated, name
        assert isinstance(observation, str) and 0 < len(observation) < 20_000, name
        assert info["invalid_action"] == (name in BAD), name


@pytest.mark.parametrize("reply, kept", [
    ("<think>I need the author of X.</think>\n<search>X</search>", "<search>X</search>"),
    ("<think>a</think><search>X</search><think>b</think>", "<search>X</search>"),
    ("<answer>Y</answer>", "<answer>Y</answer>"),
])
def test_a_warm_up_without_thoughts_keeps_the_tag(reply, kept):
    from agentgym_rl.envs.parsing import drop_thought

    assert drop_thought(reply) == kept and parse_reply(drop_thought(reply)) == parse_reply(reply)


def test_the_world_size_and_seed_are_env_arguments_its_tasks_follow():
    small = {"world_size": 200, "world_seed": 7}
    env = SearchEnv(**small)
    assert len(env.retriever.docs) < 500 and env.questions[0] != SearchEnv().questions[0]
    [task] = registry.tasks("search", "test", small)[:1]
    observation, _ = env.reset(task.index)
    assert observation == f"Question: {env.questions[0].question}" and task.category == env.questions[0].category
    with RolloutEngine(registry.env_factory("search", small), RolloutConfig()) as engine:
        assert all(t.success for t in engine.run(registry.tasks("search", "test", small)[:20], EnvExpert(), 10))
