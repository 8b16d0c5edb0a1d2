"""`check_env`: the API contract every registered environment must keep."""

from __future__ import annotations

from .base import EnvStateError, TextEnv


def _check_step_result(result: object) -> None:
    assert isinstance(result, tuple) and len(result) == 5, "step must return a 5-tuple"
    obs, reward, terminated, truncated, info = result
    assert isinstance(obs, str), f"observation must be str, got {type(obs).__name__}"
    assert isinstance(reward, (int, float)) and not isinstance(reward, bool), "reward must be a number"
    assert isinstance(terminated, bool) and isinstance(truncated, bool), "terminated/truncated must be bool"
    assert isinstance(info, dict), "info must be a dict"
    assert isinstance(info.get("success"), bool), "info['success'] must be a bool"
    assert isinstance(info.get("invalid_action"), bool), "info['invalid_action'] must be a bool"


def check_env(env: TextEnv, item_id: int | str = 0, actions: list[str] | None = None) -> None:
    """Assert the `TextEnv` contract; raises AssertionError naming the broken rule.

    Checks: step before reset raises `EnvStateError`; reset returns (str, dict with
    "item_id"); reset is deterministic for an item; the same actions give the same
    observations; an unparsable action is answered, not raised; close twice is safe; and for an
    environment that snapshots, a restore (in its episode or a new one) continues as the
    snapshot's episode did.

    Args:
        env: a fresh environment (it is closed at the end).
        item_id: the item to play.
        actions: actions to replay; by default the first available action, or "look".
    """
    try:
        env.step("look")
    except EnvStateError:
        pass
    else:
        raise AssertionError("step before reset must raise EnvStateError")

    def play() -> list[tuple]:
        obs, info = env.reset(item_id, seed=0)
        assert isinstance(obs, str) and obs, "reset must return a non-empty observation"
        assert isinstance(info, dict) and "item_id" in info, "reset info must hold 'item_id'"
        trace: list[tuple] = [(obs, info["item_id"])]
        script = actions
        if script is None:
            available = env.available_actions()
            script = [available[0] if available else "look"] * 3
        # The nonsense action first: a script that ends the episode must not skip its check.
        for action in ["!!not an action!!", *script]:
            result = env.step(action)
            _check_step_result(result)
            obs, reward, terminated, truncated, info = result
            trace.append((obs, reward, terminated, truncated))
            if action == "!!not an action!!":
                assert info["invalid_action"], "a nonsense action must set info['invalid_action']"
            if terminated or truncated:
                break
        return trace

    first, second = play(), play()
    assert first == second, "the same item and actions must give the same observations"
    _check_snapshot(env, item_id, actions)
    env.close()
    env.close()


def _expert_script(env: TextEnv, item_id: int | str, turns: int) -> list[str]:
    """The environment's expert's first `turns` actions on the item (none without an expert)."""
    env.reset(item_id, seed=0)
    script: list[str] = []
    while len(script) < turns and (action := env.expert_action()) is not None:
        script.append(action)
        if any(env.step(action)[2:4]):
            break
    return script


def _check_snapshot(env: TextEnv, item_id: int | str, actions: list[str] | None) -> None:
    """For an environment that snapshots: after a restore, the same actions give the same results
    as they did after the snapshot was taken, in the episode it came from or in another. By
    default the actions are its expert's (they change the state, so a restore that restores
    nothing is caught), else its first available action."""
    script = actions or _expert_script(env, item_id, 4)
    if not actions and len(script) < 2:  # the snapshot is taken after the first action: the rest needs some
        env.reset(item_id, seed=0)
        script = [(env.available_actions() or ["look"])[0]] * 3
    env.reset(item_id, seed=0)
    first = env.step(script[0])
    try:
        state = env.snapshot()
    except NotImplementedError:
        return
    assert isinstance(state, bytes), "snapshot must return bytes"

    def rest() -> list[tuple]:
        trace = []
        for action in [*script[1:], "!!not an action!!"]:
            try:
                obs, reward, terminated, truncated, _ = env.step(action)
            except EnvStateError as error:  # e.g. a restore that left the ended episode as it was
                trace.append(("raised", str(error)))
                break
            trace.append((obs, reward, terminated, truncated))
            if terminated or truncated:
                break
        return trace

    if first[2] or first[3]:  # the episode ended at once: nothing to continue
        return
    after = rest()
    env.restore(state)
    assert rest() == after, "after restore, the same actions must give what they gave after the snapshot"
    env.reset(item_id, seed=0)
    env.restore(state)
    assert rest() == after, "a snapshot restored into a new episode must continue the one it came from"
