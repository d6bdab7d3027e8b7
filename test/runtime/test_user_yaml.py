"""YAML files a user writes: aliases refused unexpanded, nesting bounded, one-line errors naming file and line."""

from __future__ import annotations

import time
import tracemalloc

import pytest

from mstar.user_yaml import MAX_DEPTH, UserYamlError, load_user_yaml, load_user_yaml_file, parse_user_yaml


def laughs(levels: int) -> str:
    """Each anchor a list of nine aliases of the one before: 9**levels values once expanded."""
    lines = ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_nested_aliases_are_refused_at_the_first_alias_without_expanding_them():
    tracemalloc.start()
    start = time.monotonic()
    with pytest.raises(UserYamlError) as err:
        load_user_yaml(laughs(9), "laughs.yaml")  # 387 million values, were they expanded
    took = time.monotonic() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert str(err.value) == (
        "laughs.yaml:2: not valid YAML: aliases are not accepted (*l0): write the value out (column 10)"
    )
    assert peak < 1 << 20 and took < 1.0, (peak, took)


def test_a_merge_key_needs_an_alias_and_is_refused_too():
    with pytest.raises(UserYamlError, match=r"^m.yaml:3: .*aliases are not accepted \(\*base\)"):
        load_user_yaml("base: &base {a: 1}\nother:\n  <<: *base\n", "m.yaml")


def test_an_anchor_alone_and_ordinary_files_load():
    assert load_user_yaml("a: &x 1\nb: [2, {c: d}]\n", "ok.yaml") == {"a": 1, "b": [2, {"c": "d"}]}
    root, data = parse_user_yaml("", "empty.yaml")
    assert root is None and data is None


def test_a_truncated_file_names_its_file_and_lines_in_one_line():
    with pytest.raises(UserYamlError) as err:
        load_user_yaml("world_size: 2\nnode_groups:\n  - nodes: [llm\n", "cut.yaml")
    assert str(err.value) == (
        "cut.yaml:4: not valid YAML: expected ',' or ']', but got '<stream end>' (column 1), "
        "while parsing a flow sequence at line 3, column 12"
    )


@pytest.mark.parametrize("depth, ok", [(MAX_DEPTH, True), (MAX_DEPTH + 1, False), (30000, False)])
def test_nesting_is_bounded_with_an_error_not_a_recursion_error(depth, ok):
    text = "[" * depth + "]" * depth
    if ok:
        assert load_user_yaml(text, "deep.yaml") is not None
        return
    with pytest.raises(
        UserYamlError,
        match=rf"^deep.yaml:1: not valid YAML: nested deeper than {MAX_DEPTH} levels "
        rf"\(column {MAX_DEPTH + 1}\)$",
    ):
        load_user_yaml(text, "deep.yaml")


@pytest.mark.parametrize(
    "text, needle",
    [
        ("a: 1\nwhen: 2024-13-45\n", "v.yaml:2: not valid YAML: '2024-13-45' is not a valid timestamp: month must be"),
        ("a: !!int x\n", "v.yaml:1: not valid YAML: 'x' is not a valid int"),
        ("a: !!python/object:os.system x\n", "v.yaml:1: not valid YAML: could not determine a constructor for the tag"),
    ],
)
def test_a_value_its_tag_cannot_hold_names_its_line(text, needle):
    with pytest.raises(UserYamlError) as err:
        load_user_yaml(text, "v.yaml")
    assert str(err.value).startswith(needle) and "\n" not in str(err.value), str(err.value)


def test_a_file_that_is_not_utf8_names_its_file_and_line(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"a: 1\nname: caf\xe9\n")
    with pytest.raises(UserYamlError, match=rf"^{path}:2: not UTF-8 text \(byte 14\)$"):
        load_user_yaml_file(path)
