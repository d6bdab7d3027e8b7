""".githooks/commit-msg: a subject under 72 characters, a blank second line."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

HOOK = Path(__file__).resolve().parents[2] / ".githooks" / "commit-msg"


def run_hook(message: str, tmp_path: Path) -> subprocess.CompletedProcess:
    path = tmp_path / "COMMIT_EDITMSG"
    path.write_text(message)
    return subprocess.run([str(HOOK), str(path)], capture_output=True, text=True, check=False)


@pytest.mark.parametrize(
    "message",
    ["Engine: one loop contract\n\nWhy, in the body.\n", "x" * 71 + "\n", "Subject\n# a git comment\n\nbody\n"],
)
def test_a_short_subject_with_its_detail_below_a_blank_line_passes(message, tmp_path):
    assert run_hook(message, tmp_path).returncode == 0


def test_a_subject_of_72_characters_is_refused_saying_its_length(tmp_path):
    result = run_hook("x" * 72 + "\n\nbody\n", tmp_path)
    assert result.returncode == 1 and "72 characters" in result.stderr


def test_detail_on_the_second_line_is_refused(tmp_path):
    result = run_hook("Subject\ndetail right below\n", tmp_path)
    assert result.returncode == 1 and "second line" in result.stderr
