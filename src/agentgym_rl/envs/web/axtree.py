"""Rendering Chromium's accessibility tree as the text the agent reads.

The input is the node list of the DevTools call `Accessibility.getFullAXTree`; the output has
one line per meaningful node, indented by depth, in WebArena's layout:

    [4] link 'Cart (2)'
    [7] searchbox 'Search products' value: 'kettle'

Ids are numbered 1, 2, ... in document order, so the same page state always gives the same
text (Chromium's own node ids depend on the browsing history of the renderer). `AXPage.nodes`
maps each id back to the DOM node an action targets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SKIPPED_ROLES = {"none", "generic", "presentation", "InlineTextBox", "LineBreak", "ListMarker", "paragraph",
                 "Section", "LayoutTable", "LayoutTableRow", "LayoutTableCell", "MenuListPopup"}
"""Roles whose nodes are not shown when they have no name (their children are, one level up)."""
NEVER_SHOWN = {"InlineTextBox", "LineBreak", "ListMarker"}
SHOWN_PROPERTIES = ("checked", "selected", "expanded", "disabled", "required", "level")
MAX_NAME_CHARS = 200


@dataclass(frozen=True)
class AXNode:
    """One shown node: its id in the text, role, accessible name and Chromium's DOM node id."""

    element_id: int
    role: str
    name: str
    backend_node_id: int | None


@dataclass
class AXPage:
    text: str
    nodes: dict[int, AXNode] = field(default_factory=dict)

    def find(self, role: str, name: str) -> AXNode | None:
        """The first shown node with this role and exactly this name."""
        return next((node for node in self.nodes.values() if node.role == role and node.name == name), None)


def _value(entry: dict[str, Any] | None) -> Any:
    return (entry or {}).get("value")


def _clean(text: Any) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= MAX_NAME_CHARS else text[: MAX_NAME_CHARS - 1] + "…"


def render_axtree(nodes: list[dict[str, Any]]) -> AXPage:
    """The text of a `getFullAXTree` node list (the first node is the root)."""
    if not nodes:
        return AXPage("(empty page)")
    by_id = {node["nodeId"]: node for node in nodes}
    lines: list[str] = []
    page = AXPage("")

    def visit(node: dict[str, Any], depth: int, parent_name: str) -> None:
        role = _value(node.get("role")) or ""
        name = _clean(_value(node.get("name")))
        if role in NEVER_SHOWN:
            return
        hidden = node.get("ignored") or (role in SKIPPED_ROLES and not name)
        if role == "StaticText" and (not name or name in parent_name):
            hidden = True  # the text of a link or button already named by it
        child_depth = depth
        if not hidden:
            element_id = len(page.nodes) + 1
            parts = [f"[{element_id}] {role} {name!r}"]
            value = _clean(_value(node.get("value")))
            if value and role in ("textbox", "searchbox", "spinbutton", "combobox"):
                parts.append(f"value: {value!r}")
            for prop in node.get("properties", []):
                if prop["name"] == "level" and role != "heading":
                    continue
                if prop["name"] in SHOWN_PROPERTIES and _value(prop.get("value")) not in (None, False, "false"):
                    parts.append(f"{prop['name']}: {_value(prop['value'])}")
            lines.append("\t" * depth + " ".join(parts))
            page.nodes[element_id] = AXNode(element_id, role, name, node.get("backendDOMNodeId"))
            child_depth = depth + 1
            parent_name = name or parent_name
        for child_id in node.get("childIds", []):
            child = by_id.get(child_id)
            if child is not None:
                visit(child, child_depth, parent_name)

    visit(nodes[0], 0, "")
    page.text = "\n".join(lines)
    return page
