"""Building embedded tasks: WebArena's task-config layout, expert plan steps, and splits.

A task is a dict with WebArena's keys (`task_id`, `sites`, `start_url` with a placeholder such
as `__SHOPPING__`, `intent_template`, `instantiation_dict`, `intent`, `require_reset`, `eval`)
and two of ours: `category` ("<site>/info", "<site>/navigation" or "<site>/state") and
`expert`, the steps of a scripted solution. An expert step names its target by accessibility
role and name (`{"do": "click", "role": "link", "name": "My orders"}`); the env turns it into
the element id of the page the expert sees.
"""

from __future__ import annotations

import random
import sqlite3
from typing import Any, Callable, Iterator

TEST_PER_TEMPLATE = 3
TRAIN_PER_TEMPLATE = 17

Instance = tuple[dict, dict, list]
"""(instantiation_dict, eval, expert plan) of one task."""
Template = tuple[str, str, Callable[[sqlite3.Connection, random.Random], Iterator[Instance]]]
"""(kind: info | navigation | state, intent template, instances over the site's database)."""


def click(name: str, role: str = "link") -> dict[str, Any]:
    return {"do": "click", "role": role, "name": name}


def type_into(role: str, name: str, text: str, enter: bool = False) -> dict[str, Any]:
    return {"do": "type", "role": role, "name": name, "text": text, "enter": int(enter)}


def stop(answer: str = "") -> dict[str, Any]:
    return {"do": "stop", "answer": answer}


def assemble(site: str, home: str, templates: list[Template], db: sqlite3.Connection,
             seed: int) -> tuple[list[dict], list[dict]]:
    """(test, train) task configs of `site` from its templates over its pristine database: the
    first `TEST_PER_TEMPLATE` instances of each template are test, the next ones train."""
    test: list[dict] = []
    train: list[dict] = []
    for template_id, (kind, template, instances) in enumerate(templates):
        rng = random.Random(seed * 1000 + template_id)
        for number, (values, evaluation, plan) in enumerate(instances(db, rng)):
            if number >= TEST_PER_TEMPLATE + TRAIN_PER_TEMPLATE:
                break
            task = {
                "sites": [site], "require_login": False, "storage_state": None, "start_url": home,
                "geolocation": None, "intent_template": template, "instantiation_dict": values,
                "intent": template.format(**values), "require_reset": kind == "state",
                "eval": evaluation, "intent_template_id": template_id,
                "category": f"{site}/{kind}", "expert": plan,
            }
            (test if number < TEST_PER_TEMPLATE else train).append(task)
    return test, train
