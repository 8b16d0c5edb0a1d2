"""Every metric a run logs, named once: the keys of `metrics.jsonl`, which TensorBoard, W&B and
MLflow receive as they are, and which the console, the plots, the report, the comparisons and
the viewer read (the viewer's script, which cannot import this, gets them from `/api/metrics`).

A key is `<group>/<name>`: `train/` the step's episodes, `update/` its optimizer steps, `adv/`
its advantages, `rollout/` and `time/` how it played, `val/` a validation. Keys built from a
name (a category, an environment, a loss term's own metric) come from the functions below.
`DOCS` says what each one means; docs/METRICS.md defines the episode and split figures.
"""

from __future__ import annotations

HORIZON = "horizon"
KL_COEF = "kl_coef"

TRAIN_SUCCESS = "train/success"
TRAIN_GREEDY_SUCCESS = "train/greedy_success"
TRAIN_REWARD = "train/reward"
TRAIN_REWARD_STD = "train/reward_std"
TRAIN_REPLY_TOKENS = "train/reply_tokens"
TRAIN_TURNS = "train/turns"
TRAIN_INVALID_ACTION_RATE = "train/invalid_action_rate"
TRAIN_IDLE_TURN_RATE = "train/idle_turn_rate"
TRAIN_ERRORS = "train/errors"

UPDATE_TRAJECTORIES = "update/trajectories"
UPDATE_FAILED_LEFT_OUT = "update/failed_episodes_left_out"
UPDATE_LOSS = "update/loss"
UPDATE_LR = "update/lr"
UPDATE_KL = "update/kl"
UPDATE_ENTROPY = "update/entropy"
UPDATE_GRAD_NORM = "update/grad_norm"
UPDATE_APPROX_KL = "update/approx_kl"
UPDATE_CLIP_FRACTION = "update/clip_fraction"
UPDATE_RATIO_MEAN = "update/ratio_mean"
UPDATE_SKIPPED_STEPS = "update/skipped_steps"
UPDATE_OPTIMIZER_STEPS = "update/optimizer_steps"

ADV_NUM_GROUPS = "adv/num_groups"
ADV_ZERO_VAR_GROUP_FRAC = "adv/zero_var_group_frac"
ADV_ABS_MEAN = "adv/adv_abs_mean"
ADV_REWARD_MEAN = "adv/reward_mean"
ADV_TOKEN_ABS_MEAN = "adv/token_abs_mean"
ADV_RIGHT_TOKEN_POSITIONS = "adv/right_token_positions"

ROLLOUT_LOGPROB_GAP_MEAN = "rollout/logprob_gap_mean"
ROLLOUT_LOGPROB_GAP_MAX = "rollout/logprob_gap_max"
ROLLOUT_RETRIED_EPISODES = "rollout/retried_episodes"
ROLLOUT_JOURNAL_MB = "rollout/journal_mb"
ROLLOUT_RESUMED_EPISODES = "rollout/resumed_episodes"
ROLLOUT_REREAD_EPISODES = "rollout/reread_episodes"
ROLLOUT_WINDOWS_MEAN = "rollout/windows_mean"
ROLLOUT_LONGEST_WINDOW = "rollout/longest_window"
ROLLOUT_SUMMARIES = "rollout/summaries"
ENV_SERVER_RESTARTS = "env/server_restarts"
ASYNC_STALENESS = "async/staleness"
ASYNC_TURN_STALENESS_MEAN = "async/turn_staleness_mean"
ASYNC_TURN_STALENESS_MAX = "async/turn_staleness_max"

TIME_ROLLOUT_S = "time/rollout_s"
TIME_UPDATE_S = "time/update_s"
TIME_STEP_S = "time/step_s"
TIME_ROLLOUT_TOKENS_PER_S = "time/rollout_tokens_per_s"
TIME_SCORE_S = "time/score_s"
TIME_JOURNAL_S = "time/journal_s"
TIME_WAIT_S = "time/wait_s"
TIME_ELAPSED_S = "time/elapsed_s"
TIME_SAMPLE_S = "time/sample_s"
TIME_FINETUNE_S = "time/finetune_s"
MEMORY_DEVICE_PEAK_GB = "memory/device_peak_gb"
MEMORY_DEVICE_RESERVED_GB = "memory/device_reserved_gb"

VAL_SUCCESS = "val/success"
VAL_REWARD = "val/reward"
VAL_TURNS = "val/turns"
VAL_INVALID_ACTION_RATE = "val/invalid_action_rate"

SAMPLING_REFILL_ROUNDS = "sampling/refill_rounds"
SAMPLING_EXTRA_GROUPS = "sampling/extra_groups"
SAMPLING_GROUPS_WITH_SIGNAL = "sampling/groups_with_signal"
SAMPLING_GROUPS_DROPPED = "sampling/groups_dropped"
SAMPLING_RARE_ACTION_GROUPS = "sampling/rare_action_groups"

DPO_CHOSEN = "rewards/chosen"
DPO_REJECTED = "rewards/rejected"
DPO_MARGIN = "rewards/margin"
DPO_ACCURACY = "rewards/accuracy"

SAMPLE_SUCCESS = "sample/success"
SAMPLE_ITEMS_SOLVED = "sample/items_solved"
SAMPLE_ERRORS = "sample/errors"
SFT_CONVERSATIONS = "sft/conversations"
SFT_TOO_LONG = "sft/too_long"
SFT_TOKENS = "sft/tokens"
SFT_LOSS_FIRST_EPOCH = "sft/loss_first_epoch"
SFT_LOSS_LAST_EPOCH = "sft/loss_last_epoch"


def adv(name: str) -> str:
    """An advantage estimator's own figure (`AdvantageOutput.metrics`), or a penalty's count."""
    return f"adv/{name}"


def update(name: str) -> str:
    """A figure of the optimizer steps: the loss terms' own metrics (`algos/losses.py`), averaged."""
    return f"update/{name}"


def category_success(split: str, category: str) -> str:
    """Success of one category of items, e.g. `val/success/GoTo`."""
    return f"{split}/success/{category}"


def curriculum_share(category: str) -> str:
    """The share of a step's task draws a category got (`curriculum.kind: success`)."""
    return f"curriculum/share/{category}"


def curriculum_success(category: str) -> str:
    """A category's success rate as the curriculum estimated it for a step's draws."""
    return f"curriculum/success/{category}"


def env_metric(split: str, env_id: str, name: str) -> str:
    """One environment's figure in a mix, e.g. `train/env/babyai/success`."""
    return f"{split}/env/{env_id}/{name}"


def env_of(key: str) -> str | None:
    """The environment an `env_metric` key is about (`train/env/babyai/success` -> "babyai"),
    None for any other key."""
    parts = key.split("/")
    return parts[2] if len(parts) == 4 and parts[0] in ("train", "val") and parts[1] == "env" else None


def data(name: str) -> str:
    """A figure of an SFT run's data (`data/*`, logged at step 0)."""
    return f"data/{name}"


def pairs(name: str) -> str:
    """A figure of a DPO run's preference pairs (`pairs/*`, logged at step 0)."""
    return f"pairs/{name}"


DOCS = {
    HORIZON: "the turn limit of the step's episodes (ScalingInter-RL's schedule)",
    KL_COEF: "β, the weight of the KL to the reference policy in force at the step",
    TRAIN_SUCCESS: "share of the step's episodes that succeeded",
    TRAIN_GREEDY_SUCCESS: "share of the step's greedy episodes (algo.greedy_samples) that succeeded",
    TRAIN_REWARD: "mean episode reward of the step",
    TRAIN_REWARD_STD: "spread (population SD) of the step's episode rewards: 0 means no signal to learn from",
    TRAIN_REPLY_TOKENS: "mean reply length, in trained tokens per turn",
    TRAIN_TURNS: "mean turns an episode took",
    TRAIN_INVALID_ACTION_RATE: "share of turns whose action the environment rejected",
    TRAIN_IDLE_TURN_RATE: "share of turns whose accepted action left the state as it was",
    TRAIN_ERRORS: "episodes that failed in the environment (left out of the update)",
    UPDATE_TRAJECTORIES: "episodes the update trained on (0: it updated nothing)",
    UPDATE_FAILED_LEFT_OUT: "episodes left out of the update for an environment failure",
    UPDATE_LOSS: "the objective, averaged over the optimizer steps",
    UPDATE_LR: "the learning rate of the step's optimizer steps",
    UPDATE_KL: "KL of the policy to the reference policy (with a KL term)",
    UPDATE_ENTROPY: "mean entropy of the policy at the trained tokens (nats)",
    UPDATE_GRAD_NORM: "gradient norm before clipping",
    UPDATE_APPROX_KL: "policy drift: approximate KL of the updated policy to the one that sampled the step "
                      "(0 by construction with one optimizer step)",
    UPDATE_CLIP_FRACTION: "policy drift: share of tokens whose ratio was clipped (0 with one optimizer step)",
    UPDATE_RATIO_MEAN: "mean importance ratio π_new / π_old over trained tokens (1 with one optimizer step)",
    UPDATE_SKIPPED_STEPS: "optimizer steps the algo.max_kl guard skipped",
    UPDATE_OPTIMIZER_STEPS: "optimizer steps the update took (epochs × minibatches)",
    ADV_NUM_GROUPS: "groups of samples of one task compared by the estimator",
    ADV_ZERO_VAR_GROUP_FRAC: "share of groups whose rewards tie (no advantage from them)",
    ADV_ABS_MEAN: "mean |advantage| from the estimator, before turns are discredited",
    ADV_REWARD_MEAN: "mean reward of the episodes the estimator compared (those with a trained token and no failure)",
    ADV_TOKEN_ABS_MEAN: "mean |advantage| per trained token, as the loss sees it",
    ADV_RIGHT_TOKEN_POSITIONS: "tokens where the right-token loss applies",
    ROLLOUT_LOGPROB_GAP_MEAN: "mean |log p_generator − log p_learner| over action tokens (~0 in one precision)",
    ROLLOUT_LOGPROB_GAP_MAX: "largest |log p_generator − log p_learner| over action tokens",
    ROLLOUT_RETRIED_EPISODES: "episodes played again after their environment server failed",
    ROLLOUT_JOURNAL_MB: "size of the step's in-flight journal",
    ROLLOUT_RESUMED_EPISODES: "unfinished episodes continued from the journal on resume",
    ROLLOUT_REREAD_EPISODES: "finished episodes read back from the journal on resume",
    ROLLOUT_WINDOWS_MEAN: "rollout.keep_turns: context windows an episode, on average (1: never cut)",
    ROLLOUT_LONGEST_WINDOW: "rollout.keep_turns: tokens of the step's longest context window (the most a prompt held)",
    ROLLOUT_SUMMARIES: "rollout.summarize: summaries the policy wrote in the step",
    ENV_SERVER_RESTARTS: "environment servers the run restarted so far",
    ASYNC_STALENESS: "updates between the weights that played the step and those it trains",
    ASYNC_TURN_STALENESS_MEAN: "partial rollouts: updates between the weights that wrote a turn and those it trains, "
                               "averaged over the step's turns",
    ASYNC_TURN_STALENESS_MAX: "partial rollouts: the most updates between a turn's weights and those it trains",
    TIME_ROLLOUT_S: "seconds the step's rollout took",
    TIME_UPDATE_S: "seconds the step's update took",
    TIME_STEP_S: "seconds the step took in all (rollout and update overlap when played ahead)",
    TIME_ROLLOUT_TOKENS_PER_S: "generated tokens per second of rollout",
    TIME_SCORE_S: "seconds spent scoring old, reference and value outputs",
    TIME_JOURNAL_S: "seconds spent writing the in-flight journal",
    TIME_WAIT_S: "seconds the learner waited for rollouts played ahead",
    TIME_ELAPSED_S: "seconds since the run's fine-tuning began",
    TIME_SAMPLE_S: "seconds a rejection-sampling round spent sampling",
    TIME_FINETUNE_S: "seconds a rejection-sampling round spent fine-tuning",
    MEMORY_DEVICE_PEAK_GB: "on a GPU, the most memory the step's tensors took there (GB)",
    MEMORY_DEVICE_RESERVED_GB: "on a GPU, the most memory torch's caching allocator held there during the step (GB)",
    VAL_SUCCESS: "validation success (Avg@n) on the held-out items",
    VAL_REWARD: "mean validation episode reward",
    VAL_TURNS: "mean turns of a validation episode",
    VAL_INVALID_ACTION_RATE: "share of validation turns with a rejected action",
    SAMPLING_REFILL_ROUNDS: "dynamic sampling: rounds that played new tasks for groups whose rewards tied",
    SAMPLING_EXTRA_GROUPS: "dynamic sampling: groups played beyond tasks_per_step",
    SAMPLING_GROUPS_WITH_SIGNAL: "dynamic sampling: groups whose rewards differ (a group-relative signal)",
    SAMPLING_GROUPS_DROPPED: "dynamic sampling's filter: groups left out of the update (tied, or beyond tasks_per_step)",
    SAMPLING_RARE_ACTION_GROUPS: "dynamic sampling's filter: tied groups kept for a rare action (filter_keeps_rare_actions)",
    DPO_CHOSEN: "DPO: mean implicit reward of the chosen episodes, β · log(π/π_ref)",
    DPO_REJECTED: "DPO: mean implicit reward of the rejected episodes",
    DPO_MARGIN: "DPO: mean chosen − rejected implicit reward",
    DPO_ACCURACY: "DPO: share of pairs whose chosen episode has the higher implicit reward",
    SAMPLE_SUCCESS: "share of a rejection-sampling round's samples that succeeded",
    SAMPLE_ITEMS_SOLVED: "items solved at least once in a rejection-sampling round",
    SAMPLE_ERRORS: "samples that failed in the environment",
    SFT_CONVERSATIONS: "conversations a fine-tuning round trained on",
    SFT_TOO_LONG: "conversations left out for being longer than the context",
    SFT_TOKENS: "tokens a fine-tuning round trained on",
    SFT_LOSS_FIRST_EPOCH: "fine-tuning loss of the first epoch",
    SFT_LOSS_LAST_EPOCH: "fine-tuning loss of the last epoch",
}
"""What each metric means (the viewer shows it on its metric list; `make docs` lists them)."""

FAMILIES = {
    "adv/<name>": "an advantage estimator's own figure, or a penalty's count (`adv/wrong_tokens`, ...)",
    "update/<name>": "a loss term's own metric, averaged over the optimizer steps (`algos/losses.py`)",
    "train/success/<category>, val/success/<category>": "success of one category of items",
    "curriculum/share/<category>": "the share of the step's task draws given to the category (curriculum.kind: success; "
                                   "in a mix, of its environment's draws)",
    "curriculum/success/<category>": "the category's success rate the curriculum drew the step's tasks from: (1 + successes) / "
                                     "(2 + episodes) of the steps before, recent ones weighing more",
    "train/env/<env>/success, val/env/<env>/success (and /reward)": "one environment's figure in a mix",
    "data/<name>, pairs/<name>": "an SFT run's data, a DPO run's pairs (logged at step 0)",
}
"""The keys built from a name, and what they hold."""

PREFERRED_CURVES = (TRAIN_SUCCESS, VAL_SUCCESS)
"""The curve the viewer shows first, the first of these a run logged."""
