"""The files of a benchmark suite's results (`suite.run_suite`): `results.json`, `table.md`,
`results.csv`, and the test-time scaling plots `turns.png` and `pass_at_k.png`."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any


def write_outputs(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "table.md").write_text(markdown_table(results))
    write_csv(results, out / "results.csv")
    plot_turns(results, out / "turns.png")
    plot_pass_at_k(results, out / "pass_at_k.png")


def _pct(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.1f}"


def _columns(results: dict) -> tuple[str, str]:
    suite = results["config"]["suite"]
    n = suite["samples"]
    return f"Avg@{n} (T={suite['temperature']:g})", f"Pass@{n}"


def markdown_table(results: dict) -> str:
    """The summary table (one row per env) and a table per env by category, in percent."""
    suite, seed = results["config"]["suite"], results["config"]["run"]["seed"]
    avg_n, pass_n = _columns(results)
    sampled_cols = suite["samples"] > 0
    head = ["env", "items", "turn limit", "Avg@1 greedy"] + ([avg_n, pass_n] if sampled_cols else [])
    head += ["mean turns", "invalid actions %", "errors", "generated tokens", "wall (min)", "peak RSS (GB)"]
    lines = [f"# bench-agent: {results['policy']}", "",
             f"Test splits, seed {seed}. Avg@1 greedy: one episode per item at temperature 0. "
             + (f"{avg_n}: mean success over {suite['samples']} episodes per item; {pass_n}: items solved at least "
                f"once among them (unbiased estimator). " if sampled_cols else "")
             + "Mean turns and invalid actions: the greedy pass's (the sampled one's without it); errors: "
             "episodes that failed to run, in every pass (each counts as a failure). "
             "Wall: the passes' playing time, summed over the invocations that played them; peak RSS: the "
             "largest resident memory of this process while it played (an environment's JVM or browser not "
             "counted). Definitions: docs/METRICS.md.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for env_id, result in results["envs"].items():
        if "error" in result:
            lines.append(f"| {env_id} | not run: {result['error']} |" + " |" * (len(head) - 2))
            continue
        greedy, sampled = result.get("greedy"), result.get("sampled")
        main = greedy or sampled
        row = [env_id, str(main["episodes"]), str(result["max_turns"]), _pct(greedy and greedy["success"])]
        if sampled_cols:
            row += [_pct(sampled and sampled["success"]), _pct(sampled and sampled["pass_at_k"])]
        played = [p for p in (greedy, sampled) if p]
        peaks = [p["peak_rss_gb"] for p in played if p.get("peak_rss_gb") is not None]
        row += [f"{main['avg_turns']:.1f}", _pct(main["invalid_action_rate"]), str(sum(p["errors"] for p in played)),
                str(sum(p["generated_tokens"] for p in played)), f"{sum(p['seconds'] for p in played) / 60:.1f}",
                f"{max(peaks):.2f}" if peaks else ""]
        lines.append("| " + " | ".join(row) + " |")
    for env_id, result in results["envs"].items():
        if "error" in result:
            continue
        greedy, sampled = result.get("greedy"), result.get("sampled")
        main = greedy or sampled
        head = ["category", "items", "Avg@1 greedy"] + ([avg_n, pass_n] if sampled_cols else [])
        lines += ["", f"## {env_id}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for category, items in main["items_by_category"].items():
            row = [category, str(items), _pct(greedy and greedy["by_category"][category])]
            if sampled_cols:
                row += [_pct(sampled and sampled["by_category"][category]),
                        _pct(sampled and sampled["pass_at_k_by_category"][category])]
            lines.append("| " + " | ".join(row) + " |")
    api = []
    for env_id, result in results["envs"].items():
        played = [result[name] for name in ("greedy", "sampled") if name in result]
        prompt, completion = (sum(p[key] for p in played) for key in ("api_prompt_tokens", "api_completion_tokens"))
        if prompt or completion:
            api.append(f"{env_id} {prompt} prompt, {completion} completion")
    if api:
        lines += ["", "API tokens (as the server reported them): " + "; ".join(api)]
    return "\n".join(lines) + "\n"


def write_csv(results: dict, path: Path) -> None:
    """One row per environment and category ("overall" first), success as fractions."""
    suite = results["config"]["suite"]
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["env", "category", "items", "max_turns", "greedy_avg_at_1", "samples", "temperature",
                         "avg_at_n", "pass_at_n", "error"])
        for env_id, result in results["envs"].items():
            if "error" in result:
                writer.writerow([env_id, "overall", "", result["max_turns"], "", "", "", "", "", result["error"]])
                continue
            greedy, sampled = result.get("greedy"), result.get("sampled")
            main = greedy or sampled
            for category, items in [("overall", main["episodes"]), *main["items_by_category"].items()]:
                def value(summary: dict | None, key: str, by: str) -> Any:
                    if summary is None:
                        return ""
                    return summary[key] if category == "overall" else summary[by][category]

                writer.writerow([env_id, category, items, result["max_turns"],
                                 value(greedy, "success", "by_category"),
                                 suite["samples"] if sampled else "", suite["temperature"] if sampled else "",
                                 value(sampled, "success", "by_category"),
                                 value(sampled, "pass_at_k", "pass_at_k_by_category"), ""])


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt, *plt.subplots(figsize=(6.4, 4.2))


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
"""One marker per environment: lines that coincide (two envs both at 100%) stay told apart."""


def _finish(ax, title: str, xlabel: str, ylabel: str) -> None:
    # A margin around 0-100%, so a line at 100% does not sit on the frame.
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title, ylim=(-4, 104))
    ax.margins(x=0.03)
    ax.grid(alpha=0.3)
    ax.xaxis.get_major_locator().set_params(integer=True)
    if ax.lines:
        ax.legend(fontsize="small")


def plot_turns(results: dict, path: Path) -> None:
    """Success against the turn budget, one line per env (greedy solid, sampled dashed)."""
    plt, fig, ax = _figure()
    for number, (env_id, result) in enumerate(results["envs"].items()):
        for name, style in (("greedy", "-"), ("sampled", "--")):
            if name in result:
                curve = result[name]["success_within_turns"]
                ax.step(range(1, len(curve) + 1), [100 * v for v in curve], style, where="post",
                        marker=MARKERS[number % len(MARKERS)], markevery=max(1, len(curve) // 8),
                        markersize=5, alpha=0.85, label=f"{env_id} {name}")
    _finish(ax, "Test-time scaling: interaction turns", "turn budget", "success (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_pass_at_k(results: dict, path: Path) -> None:
    """Pass@k against k (parallel samples), one line per env."""
    plt, fig, ax = _figure()
    for number, (env_id, result) in enumerate(results["envs"].items()):
        if "sampled" in result:
            curve = result["sampled"]["pass_at_k_curve"]
            ax.plot(range(1, len(curve) + 1), [100 * v for v in curve], "-", marker=MARKERS[number % len(MARKERS)],
                    alpha=0.85, label=env_id)
    temperature = results["config"]["suite"]["temperature"]
    _finish(ax, f"Test-time scaling: parallel samples (T={temperature:g})", "samples k", "Pass@k (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
