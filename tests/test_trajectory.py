from __future__ import annotations

import pytest

from agentgym_rl.errors import UserError
from agentgym_rl.rollout.trajectory import Trajectory, load_trajectories, save_trajectories


def test_jsonl_round_trip(tmp_path):
    t = Trajectory(env_id="babyai", item_id="babyai_3", category="GoTo", group=2,
                   messages=[{"role": "user", "content": "hi"}], input_ids=[1, 2, 3], loss_mask=[0, 1, 1],
                   logprobs=[0.0, -0.5, -0.25], turn_rewards=[0.0, 0.75], success=True, terminated=True,
                   invalid_actions=1, invalid_turns=[0], wrong_tokens=[2], right_tokens=[[7, 9]], error=None)
    save_trajectories([t, Trajectory(env_id="babyai", item_id="babyai_4", category="GoTo", error="boom")],
                      tmp_path / "t.jsonl")
    loaded = load_trajectories(tmp_path / "t.jsonl")
    assert loaded[0] == t and loaded[0].reward == 0.75 and loaded[0].turns == 2
    assert loaded[1].error == "boom"


def test_bad_file_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"env_id": "a", "item_id": "a_1", "category": "x"}\nnot json\n')
    with pytest.raises(UserError, match=r"bad.jsonl:2"):
        load_trajectories(path)
    with pytest.raises(UserError, match="does not exist"):
        load_trajectories(tmp_path / "missing.jsonl")


def test_a_pickle_from_before_a_field_existed_gets_its_default():
    """A journal pickled by older code lacks the fields added since: unpickled, they take their
    defaults instead of being missing attributes."""
    import pickle

    old = Trajectory("babyai", "babyai_0", "GoTo", action_tokens=[3])
    del old.__dict__["discovery_tokens"]  # as pickled before `discovery_tokens` existed
    restored = pickle.loads(pickle.dumps(old))
    assert restored.discovery_tokens == [] and restored.action_tokens == [3]
    assert restored.to_json()["discovery_tokens"] == []
