"""`agentgym-rl report RUN_DIR`: one static HTML page of a run (self-contained, to mail or archive).

It holds the training plot, the validation table per category at the first and the last
validation, the benchmark of `agentgym-rl bench-agent RUN_DIR` (its table and test-time scaling
plots) when there is one, and the resolved config.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

from ..errors import UserError
from ..eval.metrics import Summary, summarize
from ..eval.plots import plot_run
from ..rollout.trajectory import load_trajectories
from ..runs import CONFIG, read_metrics

REPORT = "index.html"


def _validation_summaries(run_dir: Path) -> list[tuple[int, Summary]]:
    """(step, `summarize` of its episodes) of the run's first and last validation."""
    files = sorted((run_dir / "validation").glob("step_*.jsonl"))
    chosen = files[:1] + files[1:][-1:]
    found = []
    for path in chosen:
        trajectories = load_trajectories(path)
        if trajectories:
            found.append((int(path.stem.rsplit("_", 1)[-1]), summarize(trajectories)))
    return found


def _table(summaries: list[tuple[int, Summary]]) -> str:
    if not summaries:
        return "<p>No validation episodes were recorded in this run.</p>"
    categories = sorted({c for _, s in summaries for c in s.by_category})
    head = "".join(f"<th>step {step}</th>" for step, _ in summaries)
    rows = [f"<tr><td>{html.escape(c)}</td>" + "".join(
        f"<td>{100 * s.by_category[c]:.1f}%</td>" if c in s.by_category else "<td></td>" for _, s in summaries)
        + "</tr>" for c in categories]
    rows.append("<tr class='total'><td>all</td>" + "".join(
        f"<td>{100 * s.success:.1f}% of {s.episodes}</td>" for _, s in summaries) + "</tr>")
    rows.append("<tr><td>invalid actions</td>" + "".join(
        f"<td>{100 * s.invalid_action_rate:.1f}%</td>" for _, s in summaries) + "</tr>")
    return f"<table><tr><th>category</th>{head}</tr>{''.join(rows)}</table>"


def _png(path: Path, alt: str) -> str:
    return f"<img alt='{html.escape(alt)}' src='data:image/png;base64,{base64.b64encode(path.read_bytes()).decode()}'>"


def _bench_section(run: Path) -> str:
    """The run's `bench/` results (`agentgym-rl bench-agent`): success per environment and the
    test-time scaling plots, or nothing when it was not benchmarked."""
    folder = run / "bench"
    if not (folder / "results.json").is_file():
        return ""
    results = json.loads((folder / "results.json").read_text())
    suite = results["config"]["suite"]
    n = suite["samples"]
    head = "<th>env</th><th>items</th><th>Avg@1 greedy</th>" + (f"<th>Avg@{n}</th><th>Pass@{n}</th>" if n else "")
    rows = []
    for env_id, result in results["envs"].items():
        if "error" in result:
            rows.append(f"<tr><td>{html.escape(env_id)}</td><td colspan='4'>not run: "
                        f"{html.escape(result['error'])}</td></tr>")
            continue
        greedy, sampled = result.get("greedy"), result.get("sampled")
        cells = [(greedy or sampled)["episodes"]] + [f"{100 * p[k]:.1f}%" if p else "" for p, k in
                                                     [(greedy, "success")] + ([(sampled, "success"),
                                                                               (sampled, "pass_at_k")] if n else [])]
        rows.append(f"<tr><td>{html.escape(env_id)}</td>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    plots = "".join(_png(folder / name, alt) for name, alt in (("turns.png", "success against the turn budget"),
                                                                ("pass_at_k.png", "Pass@k against k"))
                    if (folder / name).is_file())
    return (f"<h2>Benchmark (test splits)</h2><table><tr>{head}</tr>{''.join(rows)}</table>{plots}"
            f"<p>Files: <a href='../bench/table.md'>table.md</a>, <a href='../bench/results.csv'>results.csv</a>, "
            f"<a href='../bench/results.json'>results.json</a>, <a href='../bench/turns.png'>turns.png</a>, "
            f"<a href='../bench/pass_at_k.png'>pass_at_k.png</a> (definitions: docs/METRICS.md).</p>")


def write_report(run_dir: str | Path) -> Path:
    """Write `<run>/report/index.html`; returns its path."""
    run = Path(run_dir)
    if not (run / CONFIG).is_file():
        raise UserError(f"{str(run_dir)!r} is not a run folder: it has no {CONFIG}")
    try:
        return _write(run)
    except OSError as error:
        raise UserError(f"cannot write the report of {str(run_dir)!r}: {error.strerror or error} "
                        f"({error.filename or run / 'report'}); make the run folder writable") from None


def _write(run: Path) -> Path:
    plot = ""
    if read_metrics(run):
        plot = _png(plot_run(run), "training curves")
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(run.name)}: agentgym-rl report</title>
<style>body{{font:14px/1.4 system-ui,sans-serif;margin:2em}}td,th{{padding:.2em .8em;border-bottom:1px solid #ddd;
text-align:left}}table{{border-collapse:collapse}}tr.total{{font-weight:600}}pre{{background:#f6f6f6;padding:.6em}}
img{{max-width:100%}}</style></head><body>
<h1>{html.escape(run.name)}</h1>
<h2>Training</h2>{plot or "<p>No metrics were logged.</p>"}
<h2>Validation success per category</h2>{_table(_validation_summaries(run))}
{_bench_section(run)}
<h2>Config</h2><pre>{html.escape((run / CONFIG).read_text())}</pre>
<p>Browse its trajectories with <code>agentgym-rl view {html.escape(str(run.parent))}</code>.</p>
</body></html>
"""
    out = run / "report" / REPORT
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page)
    return out
