"""Reading YAML files a user writes (placement files, engine configs): hostile or broken ones fail fast.

Aliases are refused, not expanded: nine nested anchors of nine aliases each (a few hundred
bytes) stand for 387 million values, and anything that walks the data (a line mapper, a
schema check) would walk them all. ROS 2's own parameter-file parser refuses aliases too.
Nesting is bounded, so a file of ``[[[[...`` gets an error, not a RecursionError. Every
error is one line that names the file, the line and what is wrong.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

MAX_DEPTH = 64  # our files nest a handful of levels; PyYAML composes recursively


class UserYamlError(ValueError):
    """A YAML file that cannot be read; the message is ``FILE:LINE: what is wrong``."""


class _RefusingLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases and nesting deeper than MAX_DEPTH while composing, and says
    which node a value its tag cannot hold (``2024-13-45``, ``!!int x``) came from."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise yaml.MarkedYAMLError(
                problem=f"aliases are not accepted (*{event.anchor}): write the value out",
                problem_mark=event.start_mark,
            )
        if self.depth >= MAX_DEPTH:
            raise yaml.MarkedYAMLError(problem=f"nested deeper than {MAX_DEPTH} levels", problem_mark=event.start_mark)
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, TypeError) as exc:
            raise yaml.MarkedYAMLError(
                problem=f"{node.value!r} is not a valid {node.tag.rsplit(':', 1)[-1]}: {exc}",
                problem_mark=node.start_mark,
            ) from None


def _one_line(exc: yaml.YAMLError, source: str) -> UserYamlError:
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem_mark is None:
        return UserYamlError(f"{source}: not valid YAML: {' '.join(str(exc).split())}")
    mark = exc.problem_mark
    message = f"{source}:{mark.line + 1}: not valid YAML: {exc.problem} (column {mark.column + 1})"
    if exc.context and exc.context_mark is not None:
        at = exc.context_mark
        message += f", {exc.context} at line {at.line + 1}, column {at.column + 1}"
    elif exc.context:
        message += f", {exc.context}"
    return UserYamlError(message)


def parse_user_yaml(text: str, source: str) -> tuple[yaml.Node | None, Any]:
    """The document's node tree (each node has its start_mark) and its plain Python values
    (dicts, lists, scalars); (None, None) for an empty document."""
    loader = _RefusingLoader(text)
    try:
        root = loader.get_single_node()
        return root, None if root is None else loader.construct_document(root)
    except yaml.YAMLError as exc:
        raise _one_line(exc, source) from None
    finally:
        loader.dispose()


def load_user_yaml(text: str, source: str) -> Any:
    return parse_user_yaml(text, source)[1]


def read_user_yaml_text(path: str | Path) -> str:
    """The file's text; bytes that are not UTF-8 get an error naming the file and the line."""
    path = Path(path)
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise UserYamlError(f"{path}:{line}: not UTF-8 text (byte {exc.start})") from None


def load_user_yaml_file(path: str | Path) -> Any:
    return load_user_yaml(read_user_yaml_text(path), str(path))
