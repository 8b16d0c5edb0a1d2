"""Reward functions the tests name in `env.reward` (importable: tests/ is on the path)."""


def half(trajectory, info):
    return 0.5


def by_turns(trajectory, info):
    """1 for a one-turn episode, less for longer ones; the environment's success doubles it."""
    return (2.0 if trajectory.success else 1.0) / trajectory.turns


def broken(trajectory, info):
    raise RuntimeError("the judge is down")


def not_a_number(trajectory, info):
    return "high"


NOT_CALLABLE = 3


def reply_chars(trajectory, info):
    """The characters the policy wrote, over 100: sampled replies differ, so a group has a spread."""
    return sum(len(m["content"]) for m in trajectory.messages if m["role"] == "assistant") / 100


def reply_chars_and_a_half(trajectory, info):
    return reply_chars(trajectory, info) + 0.5


def transcript_score(trajectory, info):
    """What the stand-in judge of tests/test_judge.py answers for this episode."""
    from agentgym_rl.rollout.judge import transcript

    return judge_score(transcript(trajectory))


def judge_score(text: str) -> float:
    return (len(text) % 7) / 10
