"""mkdocs hook (mkdocs.yml): the reference pages, generated from the code at every build.

- reference/config.md: every key of every command's config, from the config classes, as
  `agentgym-rl config --keys` lists them (the same rows: `config.describe.config_keys`);
- reference/metrics.md: every key of `metrics.jsonl`, from `agentgym_rl.metric_names`;
- reference/cli.md: every command with its arguments and options, from the Typer app, by
  Typer's own Markdown writer (what `typer agentgym_rl.cli utils docs` prints).
"""

from __future__ import annotations

from mkdocs.structure.files import File, Files

CONFIG_INTRO = """# Config keys

Every key a config file or a `key.sub=value` override can set, per command, generated from the
config classes (`src/agentgym_rl/config/`). `agentgym-rl config --keys --kind KIND` prints the
same list; `agentgym-rl config CONFIG.yaml` prints a config resolved, each key under its
description. A key left out of a file takes the default shown here; RL's `algo.*` keys left
`null` take the algorithm's own value (`agentgym-rl algos --settings`).
"""


def config_reference() -> str:
    from agentgym_rl.config.describe import _classes, keys_markdown

    pages = [CONFIG_INTRO]
    for kind, cls in _classes().items():
        summary = (cls.__doc__ or "").strip().split("\n\n")[0]
        pages.append(f"## `agentgym-rl {kind}`: {cls.__name__}\n\n{' '.join(summary.split())}\n\n{keys_markdown(cls)}")
    return "\n".join(pages)


def metrics_reference() -> str:
    from agentgym_rl import metric_names

    rows = "\n".join(f"| `{key}` | {text} |" for key, text in metric_names.DOCS.items())
    families = "\n".join(f"| `{key}` | {text} |" for key, text in metric_names.FAMILIES.items())
    return f"""# Training metrics

What a run writes to `metrics.jsonl`, one line per step (and per validation), and sends as it is
to TensorBoard, Weights & Biases and MLflow; the viewer shows the same names. Generated from
`src/agentgym_rl/metric_names.py`, where every key is declared once. [Metrics](../METRICS.md)
defines the episode and split figures (success, Avg@n, Pass@k) they are made of.

| key | what it is |
|---|---|
{rows}

Keys built from a name:

| key | what it is |
|---|---|
{families}
"""


def cli_reference() -> str:
    import typer.main
    from typer.cli import get_docs_for_click
    from typer.models import Context

    from agentgym_rl.cli import app

    command = typer.main.get_command(app)
    docs = get_docs_for_click(obj=command, ctx=Context(command), name="agentgym-rl", title="Commands")
    return docs.replace("```console", "```text")


def on_files(files: Files, config) -> Files:
    for path, content in (("reference/config.md", config_reference()), ("reference/cli.md", cli_reference()),
                          ("reference/metrics.md", metrics_reference())):
        files.append(File.generated(config, path, content=content))
    return files
