"""Line numbers of a user's YAML file by path, so a schema error can say where the bad field is.

lines = YamlLines(root)                 # root: the node tree of mstar.user_yaml.parse_user_yaml
lines.at(("processes", 1, "threads"))   # -> 12 (the nearest enclosing node's line if absent)

Used by the placement file (mstar.placement.schema) and the edge config (mstar_ros.edge.config).
"""

from __future__ import annotations

import re

import yaml


class YamlLines:
    """Line numbers of the YAML nodes, by path (("node_groups", 1, "ranks") -> 12). Walks the file's own
    tree: ``parse_user_yaml`` refuses aliases, so no node is visited twice."""

    def __init__(self, root: yaml.Node | None) -> None:
        self.lines: dict[tuple, int] = {}
        if root is not None:
            self._walk(root, ())

    def _walk(self, node: yaml.Node, path: tuple) -> None:
        self.lines.setdefault(path, node.start_mark.line + 1)  # a mapping key keeps its own line
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                name = key.value
                try:
                    name = int(name)  # an integer key (a placement's devices: {0: cpu}) as msgspec names it
                except (TypeError, ValueError):
                    pass
                self.lines[path + (name,)] = key.start_mark.line + 1
                self._walk(value, path + (name,))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self._walk(item, path + (i,))

    def at(self, path: tuple) -> int | None:
        while path and path not in self.lines:
            path = path[:-1]
        return self.lines.get(path)


def field_name(path: tuple) -> str:
    """("processes", 1, "threads") -> 'processes[1].threads'."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def msgspec_path(message: str) -> tuple:
    """msgspec's '... - at `$.processes[1].threads`' -> ("processes", 1, "threads")."""
    match = re.search(r"at `\$(.*)`", message)
    if not match:
        return ()
    return tuple(name if name else int(index) for name, index in re.findall(r"\.(\w+)|\[(\d+)\]", match.group(1)))
