"""Loading a config: YAML, then `key.sub=value` overrides, then pydantic's validation of the
whole; every mistake becomes a one-line `UserError` naming the key."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError

from ..errors import UserError

MOVED = {"run_name": "run.name", "output_dir": "run.output_dir", "seed": "run.seed",
         "train.validation_episodes": "eval.episodes", "train.validation_max_turns": "eval.max_turns",
         "train.validation_temperature": "eval.temperature", "warmup.lr": "warmup.optim.lr",
         "warmup.lr_schedule": "warmup.optim.lr_schedule", "warmup.lr_warmup_steps": "warmup.optim.lr_warmup_steps",
         "train.lr_schedule": "optim.lr_schedule", "train.lr_warmup_steps": "optim.lr_warmup_steps",
         "data.env": "env.id", "data.env_kwargs": "env.kwargs", "data.split": "env.train_split"}
"""Keys of earlier versions and where they live now (named in the error of an unknown key)."""


def _key(location: tuple) -> str:
    """('schedule', 'horizons', 1) -> 'schedule.horizons[1]'."""
    key = ""
    for part in location:
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else str(part))
    return key


def _known_keys(cls: type, location: tuple) -> list[str]:
    """The field names of the section at `location` of config class `cls`."""
    for part in location:
        if not dataclasses.is_dataclass(cls):
            return []
        hints = typing.get_type_hints(cls)
        cls = hints.get(part) if isinstance(part, str) else None
    return sorted(f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else []


def _union_error(cls: type, errors: list[dict[str, Any]]) -> dict[str, Any]:
    """The first of pydantic's errors; where a value fit no member of a union field (pydantic
    reports each member's complaint under a tag such as `constrained-int`), one error at the
    field saying them all."""
    first = errors[0]
    location = tuple(first["loc"])
    if (first["type"] == "unexpected_keyword_argument" or len(location) < 2 or not isinstance(location[-1], str)
            or location[-1] in _known_keys(cls, location[:-1])):
        return first
    members = [e for e in errors if tuple(e["loc"])[:-1] == location[:-1]]
    if len(members) < 2:
        return first
    said = "; or ".join(dict.fromkeys(e["msg"].removeprefix("Input should be ") for e in members))
    return {**first, "loc": location[:-1], "msg": f"Input should be {said}"}


def _message(cls: type, error: dict[str, Any]) -> str:
    """One line for the first of pydantic's errors."""
    location = tuple(error["loc"])
    key = _key(location)
    if error["type"] == "unexpected_keyword_argument":
        moved = MOVED.get(key)
        if moved:
            return f"unknown config key '{key}': it is '{moved}' now"
        known = _known_keys(cls, location[:-1])
        return f"unknown config key '{key}'" + (f"; known here: {', '.join(known)}" if known else "")
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "value_error":  # a check across fields of the section at `key`
        return f"bad config{' in ' + key if key else ''}: {message}"
    return f"config key '{key}': {message[0].lower()}{message[1:]}, got {error.get('input')!r}"


def from_dict(cls: type, data: dict[str, Any]) -> Any:
    """Build the config dataclass `cls` from nested dicts; a bad key or value raises UserError."""
    try:
        return TypeAdapter(cls).validate_python(data)
    except ValidationError as error:
        raise UserError(_message(cls, _union_error(cls, error.errors()))) from None


def apply_override(data: dict[str, Any], override: str) -> None:
    """Apply one `a.b.c=value` override in place; the value is parsed as YAML."""
    key, sep, raw = override.partition("=")
    if not sep or not key.strip():
        raise UserError(f"override {override!r} is not of the form key=value")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        raise UserError(f"override {override!r}: the value is not valid YAML") from None
    set_key(data, key.strip(), value)


def set_key(data: dict[str, Any], key: str, value: Any) -> None:
    """Set `a.b.c` of nested dicts `data` to `value` in place, creating sections as needed."""
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise UserError(f"override of {key!r}: '{part}' is not a section")
    node[parts[-1]] = value


class _KeyGivenTwice(yaml.constructor.ConstructorError):
    """A mapping that gives a key twice (`_UniqueKeyLoader`): its message is worth showing."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a mapping that gives a key twice (PyYAML keeps the last one
    without a word, so the first of two `lr:` lines would be silently ignored)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor`: the base constructor merges it (a later key overrides it)
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, typing.Hashable):
                continue  # the base constructor refuses it with its own message
            if key in seen:
                raise _KeyGivenTwice(None, None, f"the key {key!r} is given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


class _LegibleDumper(yaml.SafeDumper):
    """Writes a string holding a line break double-quoted, "\\n" and all, on its key's line
    (plain YAML would fold it over the lines below: `- '` and `'` around an empty one)."""


def _legible_string(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = '"' if any(c in text for c in "\n\r") else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_LegibleDumper.add_representer(str, _legible_string)


def dump_yaml(data: Any, **options: Any) -> str:
    """`data` as YAML, keys in their order, that `load_yaml` reads back to the same values (a
    run's `config.yaml`, `agentgym-rl config`); `options` go to `yaml.dump`."""
    return yaml.dump(data, Dumper=_LegibleDumper, sort_keys=False, **options)


def load_yaml(path: str | Path) -> dict[str, Any]:
    source = Path(path)
    if source.is_dir():
        raise UserError(f"config file {str(path)!r} is a folder; give a YAML file (e.g. configs/babyai_grpo.yaml)")
    if not source.is_file():
        raise UserError(f"config file {str(path)!r} does not exist")
    try:
        data = yaml.load(source.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader) or {}
    except UnicodeDecodeError:
        raise UserError(f"config file {str(path)!r} is not a UTF-8 text file") from None
    except OSError as error:
        raise UserError(f"cannot read config file {str(path)!r}: {error.strerror or error}") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        detail = f": {error.problem}" if isinstance(error, _KeyGivenTwice) else ""
        raise UserError(f"config file {str(path)!r}{line} is not valid YAML{detail}") from None
    if not isinstance(data, dict):
        raise UserError(f"config file {str(path)!r} must hold a mapping at the top level")
    return data


C = typing.TypeVar("C")


def load_config(cls: type[C], path: str | Path | None, overrides: list[str] = ()) -> C:
    """Load a config dataclass `cls` from YAML (defaults when `path` is None) plus overrides."""
    data = load_yaml(path) if path is not None else {}
    for override in overrides:
        apply_override(data, override)
    return from_dict(cls, data)


def to_dict(config: Any) -> dict[str, Any]:
    """A config as plain data (what a run folder's `config.yaml` holds)."""
    return dataclasses.asdict(config)
