"""The training plot: its smoothing and its panels."""

import pytest

from agentgym_rl.eval.plots import smoothing_window, trailing_mean, training_figure


def test_trailing_mean_by_hand():
    assert trailing_mean([1.0, 0.0, 1.0, 1.0], 2) == [1.0, 0.5, 0.5, 1.0]
    assert trailing_mean([0.2, 0.4, 0.9], 3) == pytest.approx([0.2, 0.3, 0.5])
    assert trailing_mean([0.3, 0.7], 1) == [0.3, 0.7]
    assert trailing_mean([], 4) == []
    with pytest.raises(ValueError, match="window"):
        trailing_mean([1.0], 0)


def test_smoothing_window_is_a_tenth_of_the_run_within_1_and_20():
    assert [smoothing_window(n) for n in (0, 9, 44, 120, 1000)] == [1, 1, 4, 12, 20]


def _rows(steps: int, entropy: bool) -> list[dict]:
    rows = [{"step": 0, "val/success": 0.1}]
    for step in range(1, steps + 1):
        rows.append({"step": step, "horizon": 4 if step <= steps // 2 else 6, "train/success": step / steps,
                     "train/reward": step / steps - 0.3, "train/turns": 4.0 if step <= steps // 2 else 6.0,
                     "update/loss": 1.0 / step, "update/approx_kl": 0.01,
                     **({"update/entropy": 2.0} if entropy else {})})
    return rows


def test_the_training_figure_has_success_turns_loss_and_kl_panels_on_integer_steps():
    import matplotlib.pyplot as plt

    fig = training_figure(_rows(7, entropy=False), "run")
    try:
        success, turns, loss, kl = fig.axes[:4]
        assert [ax.get_title() for ax in (success, turns, loss, kl)] == [
            "success", "interaction horizon", "loss", "KL and entropy"]
        assert {"train success", "train reward", "validation success"} <= set(success.get_legend_handles_labels()[1])
        assert success.get_ylim()[0] < 1 / 7 - 0.3  # the lowest reward, below 0, stays in view
        assert "loss" in loss.get_legend_handles_labels()[1]
        assert "policy drift: KL to the sampling policy" in kl.get_legend_handles_labels()[1]
        assert any("no update logged yet" in text.get_text() for text in kl.texts)  # no entropy in these rows
        # The horizon is drawn over the turns used, which sit on it here.
        lines = {line.get_label(): line for line in turns.lines}
        assert lines["horizon (max turns)"].get_zorder() > lines["mean turns used"].get_zorder()
        fig.canvas.draw()
        for ax in (loss, kl):
            labels = [tick.get_text().replace("\N{MINUS SIGN}", "-") for tick in ax.get_xticklabels()]
            assert labels and all(float(label).is_integer() for label in labels if label), labels
    finally:
        plt.close(fig)


def test_a_logged_entropy_gets_its_own_axis():
    import matplotlib.pyplot as plt

    fig = training_figure(_rows(30, entropy=True), "run")
    try:
        entropy_axis = fig.axes[4]  # the KL panel's twin
        assert entropy_axis.get_ylabel() == "entropy (nats)"
        assert not any("no update logged yet" in text.get_text() for text in fig.axes[3].texts)
        legend = [text.get_text() for text in fig.axes[3].get_legend().get_texts()]
        assert "entropy (mean of 3 steps)" in legend
        assert "policy drift: KL to the sampling policy (mean of 3 steps)" in legend
    finally:
        plt.close(fig)


def test_a_one_step_run_shows_its_point_and_a_long_run_its_lines():
    import matplotlib.pyplot as plt

    for steps, marked in ((1, True), (40, False)):
        fig = training_figure(_rows(steps, entropy=True), "run")
        try:
            lines = {line.get_label(): line for ax in fig.axes for line in ax.lines}
            for label in ("train success", "mean turns used", "loss", "horizon (max turns)"):
                line = next(line for name, line in lines.items() if name.startswith(label))
                assert (line.get_marker() not in (None, "None", "")) == marked, (steps, label)
        finally:
            plt.close(fig)


def test_the_title_names_the_algorithm_and_the_schedule(tmp_path):
    from agentgym_rl.eval.plots import run_title

    run = tmp_path / "mine"
    run.mkdir()
    rows = _rows(4, entropy=False)
    assert run_title(run, rows) == "mine: ScalingInter-RL horizons 4 → 6"  # no config: the horizons logged
    (run / "config.yaml").write_text("algo: {name: grpo}\nschedule: {kind: stepwise, horizons: [6, 13, 20], every: 50}\n")
    assert run_title(run, rows) == "mine: grpo, ScalingInter-RL horizons 6 → 13 → 20 every 50 steps"
    (run / "config.yaml").write_text("algo: {name: ppo}\nschedule: {kind: fixed, horizons: [8], every: 100}\n")
    assert run_title(run, rows) == "mine: ppo, fixed horizon 8"


def test_bench_plots_mark_each_env_and_keep_100_percent_off_the_frame(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from agentgym_rl.eval.suite_report import plot_pass_at_k, plot_turns

    close, figures = plt.close, []
    monkeypatch.setattr(plt, "close", figures.append)  # keep each figure to look at
    curve = [0.5, 1.0, 1.0]  # both envs at 100%: the same line
    results = {"config": {"suite": {"temperature": 1.0}}, "envs": {
        env_id: {"greedy": {"success_within_turns": curve},
                 "sampled": {"success_within_turns": curve, "pass_at_k_curve": curve}}
        for env_id in ("babyai", "textcraft")}}
    plot_turns(results, tmp_path / "turns.png")
    plot_pass_at_k(results, tmp_path / "pass_at_k.png")
    try:
        for figure in figures:
            ax = figure.axes[0]
            by_env = {line.get_label().split()[0]: line.get_marker() for line in ax.lines}
            assert set(by_env) == {"babyai", "textcraft"} and len(set(by_env.values())) == 2, by_env
            low, high = ax.get_ylim()
            assert low < 0 and high > 100
    finally:
        for figure in figures:
            close(figure)


def test_a_mix_gets_a_success_curve_and_validation_markers_per_environment():
    import matplotlib.pyplot as plt

    from agentgym_rl.eval.plots import mixed_envs

    rows = _rows(7, entropy=False)
    for row in rows[1:]:
        row.update({"train/env/babyai/success": 0.5, "train/env/textcraft/success": 0.1})
    rows[0].update({"val/env/babyai/success": 0.4, "val/env/textcraft/success": 0.0})
    assert mixed_envs(rows) == ["babyai", "textcraft"] and mixed_envs(_rows(3, entropy=False)) == []
    fig = training_figure(rows, "run")
    try:
        labels = set(fig.axes[0].get_legend_handles_labels()[1])
        assert {"train success: babyai", "train success: textcraft", "validation: babyai",
                "validation: textcraft"} <= labels
    finally:
        plt.close(fig)


def test_the_bench_table_counts_errors_of_every_pass():
    from agentgym_rl.eval.metrics import summarize
    from agentgym_rl.eval.suite_report import markdown_table
    from agentgym_rl.rollout.trajectory import Trajectory

    def played(episodes):
        summary = summarize(episodes).as_dict()
        return {**summary, "items_by_category": {"GoTo": 2}, "generated_tokens": 10, "seconds": 60.0,
                "peak_rss_gb": None, "api_prompt_tokens": 0, "api_completion_tokens": 0}

    greedy = [Trajectory("babyai", f"babyai_{i}", "GoTo", success=i == 0, turn_rewards=[0.0]) for i in range(2)]
    sampled = [Trajectory("babyai", f"babyai_{i}", "GoTo", turn_rewards=[0.0], error="server gone" if i else None)
               for i in (0, 0, 1, 1)]
    results = {"policy": "p", "config": {"suite": {"samples": 2, "temperature": 1.0}, "run": {"seed": 0}},
               "envs": {"babyai": {"max_turns": 20, "greedy": played(greedy), "sampled": played(sampled)}}}
    row = next(line for line in markdown_table(results).splitlines() if line.startswith("| babyai |"))
    # greedy 50% (no error); sampled 0% with 2 episodes that failed to run: the errors column says 2
    assert row.split(" | ")[3:9] == ["50.0", "0.0", "0.0", "1.0", "0.0", "2"], row
