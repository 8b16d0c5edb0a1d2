"""Text environments behind one Gymnasium-shaped API."""

from .base import EnvStateError, TextEnv
from .checker import check_env
from .registry import EnvSpec, env_ids, make, make_expert, register, spec, tasks
from .tasks import Task

__all__ = [
    "EnvSpec", "EnvStateError", "Task", "TextEnv", "check_env", "env_ids", "make",
    "make_expert", "register", "spec", "tasks",
]
