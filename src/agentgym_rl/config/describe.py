"""A config written out with what each key means (`agentgym-rl config`): the resolved YAML with
each key's description as a comment above it, or one line per key with its type and default."""

from __future__ import annotations

import dataclasses
import textwrap
import typing
from pathlib import Path
from typing import Any, Iterator

from ..errors import UserError
from .loader import dump_yaml, load_config, load_yaml

WIDTH = 100


def _classes() -> dict[str, type]:
    """The config class of each command that runs a config."""
    from .imitation import DPOConfig, RFTConfig, SFTConfig
    from .rl import RLConfig

    return {"train": RLConfig, "sft": SFTConfig, "dpo": DPOConfig, "rft": RFTConfig}


def config_class(path: str | Path | None, kind: str) -> type:
    """The config class of a YAML file: `kind` (train, sft, dpo, rft), or with "auto" the one
    whose sections hold every top-level key of the file with the fewest sections to spare."""
    classes = _classes()
    if kind != "auto":
        if kind not in classes:
            raise UserError(f"--kind must be auto or one of {', '.join(classes)}, got {kind!r}")
        return classes[kind]
    data = load_yaml(path) if path is not None else {}
    keys = set(data) if isinstance(data, dict) else set()
    fitting = [cls for cls in classes.values() if keys <= set(cls.__pydantic_fields__)]
    # Sections alone can be ambiguous (`train: {steps: 2}` has SFT's sections too): a class that
    # loads the file goes first.
    loading = [cls for cls in fitting if _loads(cls, path)]
    pool = loading or fitting
    return min(pool, key=lambda cls: len(cls.__pydantic_fields__)) if pool else classes["train"]


def _loads(cls: type, path: str | Path | None) -> bool:
    try:
        load_config(cls, path)
    except UserError:
        return False
    return True


def config_kind(path: str | Path | None, kind: str) -> str:
    """The command (train, sft, dpo, rft) that runs a YAML file (`config_class`'s choice)."""
    cls = config_class(path, kind)
    return next(name for name, candidate in _classes().items() if candidate is cls)


def load_for_command(command: str, path: str | Path, overrides: list[str]) -> Any:
    """`command`'s config (train, sft, dpo, rft) from `path` plus `overrides`. A file that only
    another command can run is refused naming that command: `train configs/babyai_sft.yaml`
    would otherwise stop at a key RL has no use for ("unknown config key 'train.epochs'")."""
    classes = _classes()
    try:
        return load_config(classes[command], path, overrides)
    except UserError as error:
        runs_it = [other for other, cls in classes.items() if _loads(cls, path)]
        if runs_it and command not in runs_it:
            raise UserError(f"{error}; {path} is a config for `agentgym-rl {runs_it[0]}`: run "
                            f"`agentgym-rl {runs_it[0]} {path}`") from None
        raise


def _description(owner: type, name: str) -> str:
    """A field's docstring, from the class that declares it (pydantic reads attribute docstrings
    only from a class's own source, so an inherited field has its description on a base)."""
    for cls in owner.__mro__:
        info = getattr(cls, "__pydantic_fields__", {}).get(name)
        if info is not None and info.description:
            return " ".join(info.description.split())
    return ""


def _plain(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _flow(value: Any) -> str:
    """`value` as one line of YAML (a scalar, or a list or mapping in flow style)."""
    text = dump_yaml(_plain(value), default_flow_style=True, width=10**6)
    return text.removesuffix("\n").removesuffix("\n...").strip()


def _comment(text: str, pad: str) -> list[str]:
    return [f"{pad}# {line}" for line in textwrap.wrap(text, WIDTH - len(pad) - 2)] if text else []


def described_yaml(config: Any) -> str:
    """`config` as YAML that loads back to the same values, each key under its description."""
    lines: list[str] = []

    def section(obj: Any, depth: int) -> None:
        pad = "  " * depth
        for field in dataclasses.fields(obj):
            value = getattr(obj, field.name)
            text = _description(type(obj), field.name)
            if dataclasses.is_dataclass(value):
                lines.extend(_comment(text or (type(value).__doc__ or "").split("\n\n")[0], pad))
                lines.append(f"{pad}{field.name}:")
                section(value, depth + 1)
            else:
                lines.extend(_comment(text, pad))
                lines.append(f"{pad}{field.name}: {_flow(value)}")
            if depth == 0:
                lines.append("")

    section(config, 0)
    return "\n".join(lines).rstrip() + "\n"


def config_keys(cls: type, prefix: str = "") -> Iterator[tuple[str, str, Any, str]]:
    """(key, type, default, description) of every key of config class `cls`, depth first."""
    hints = typing.get_type_hints(cls)
    defaults = cls()
    for field in dataclasses.fields(cls):
        kind = hints[field.name]
        if dataclasses.is_dataclass(kind):
            yield from config_keys(kind, f"{prefix}{field.name}.")
            continue
        shown = kind.__name__ if isinstance(kind, type) else str(kind).replace("typing.", "")
        yield f"{prefix}{field.name}", shown, getattr(defaults, field.name), _description(cls, field.name)


def keys_table(cls: type) -> str:
    """One line per key: name, type, default, then its description."""
    rows = list(config_keys(cls))
    width = max(len(key) for key, *_ in rows)
    return "\n".join(f"{key:<{width}}  {kind} = {_plain(default)!r}" + (f"  # {text}" if text else "")
                     for key, kind, default, text in rows) + "\n"


def keys_markdown(cls: type) -> str:
    """Every key of config class `cls` as Markdown, one table per top-level section (the docs
    site's config reference: the same rows as `keys_table`)."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("<", "&lt;")

    sections: dict[str, list[str]] = {}
    for key, kind, default, text in config_keys(cls):
        section = key.split(".")[0]
        sections.setdefault(section, []).append(
            f"| `{key}` | {cell(kind)} | `{_flow(default).replace('|', chr(92) + '|')}` | {cell(text)} |")
    return "\n".join(f"### `{section}`\n\n| key | type | default | what it does |\n|---|---|---|---|\n"
                     + "\n".join(rows) + "\n" for section, rows in sections.items())


def show_config(path: str | Path | None, overrides: list[str], kind: str = "auto", keys: bool = False) -> str:
    """What `agentgym-rl config` prints."""
    cls = config_class(path, kind)
    if keys:
        return keys_table(cls)
    config = load_config(cls, path, overrides)
    return f"# {cls.__name__}: {(cls.__doc__ or '').strip().splitlines()[0]}\n" + described_yaml(config)
