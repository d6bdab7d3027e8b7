"""Broken bags: `bag info` and `bag play` say in one line which file is wrong and how, and exit 2.

The broken bags are made from a small good one (MCAP and SQLite) by cutting, emptying, overwriting
or rewriting its files, as a crashed recorder, a full disk or a careless edit leaves them.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mstar_ros.bag.synthetic import SyntheticBagSpec, write_synthetic_bag
from mstar_ros.cli.main import main


def _good(root: Path, storage: str) -> Path:
    path = root / f"good_{storage}"
    write_synthetic_bag(path, SyntheticBagSpec(robots=1, seconds=2.0, seed=1, width=32, height=32, storage=storage))
    return path


@pytest.fixture(scope="module")
def good_bags(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("good")
    return {storage: _good(root, storage) for storage in ("mcap", "sqlite3")}


def _storage(bag: Path) -> Path:
    (file,) = [p for p in bag.iterdir() if p.suffix in (".mcap", ".db3")]
    return file


def _copy(good: Path, to: Path) -> tuple[Path, Path]:
    shutil.copytree(good, to)
    return to, _storage(to)


def _cut(file: Path, keep: int) -> None:
    file.write_bytes(file.read_bytes()[:keep])


def broken_bag(kind: str, good: dict[str, Path], root: Path) -> tuple[Path, str, str]:
    """(path to give, file the error must name, words it must say)."""
    if kind in ("truncated mcap", "empty mcap", "not mcap", "truncated mcap file", "mcap of 8 bytes"):
        bag, file = _copy(good["mcap"], root / "bag")
        if kind == "truncated mcap":
            _cut(file, file.stat().st_size // 2)
            return bag, str(file), "truncated MCAP"
        if kind == "empty mcap":
            _cut(file, 0)
            return bag, str(file), "empty file"
        if kind == "not mcap":
            file.write_bytes(b"PK\x03\x04" + bytes(5000))
            return bag, str(file), "not an MCAP file"
        if kind == "mcap of 8 bytes":  # rosbags' parser fails with a TypeError on this one
            _cut(file, 8)
            return file, str(file), "corrupt or truncated MCAP"
        _cut(file, 3000)  # the .mcap file given by itself
        return file, str(file), "truncated MCAP"
    if kind in ("truncated sqlite", "not sqlite", "empty sqlite"):
        bag, file = _copy(good["sqlite3"], root / "bag")
        if kind == "truncated sqlite":
            _cut(file, 3000)
            return bag, str(file), "corrupt or truncated SQLite database"
        if kind == "empty sqlite":
            _cut(file, 0)
            return file, str(file), "no rosbag2 tables"
        file.write_bytes(b"this is no database\n" * 200)
        return bag, str(file), "not a SQLite database"
    bag, _file = _copy(good["mcap"], root / "bag")
    meta = bag / "metadata.yaml"
    if kind == "metadata not yaml":
        meta.write_text("rosbag2_bagfile_information:\n  version: [5\n  storage_identifier: mcap\n")
        return bag, str(meta), f"{meta}:3: not valid YAML"
    if kind == "metadata nested too deep":
        meta.write_text("rosbag2_bagfile_information: " + "[" * 30000 + "\n")  # was a RecursionError
        return bag, str(meta), f"{meta}:1: not valid YAML: nested deeper than"
    if kind == "metadata not a mapping":
        meta.write_text("just a string\n")
        return bag, str(meta), "no rosbag2_bagfile_information mapping"
    if kind == "metadata missing a key":
        text = "\n".join(line for line in meta.read_text().splitlines() if not line.strip().startswith("version:"))
        meta.write_text(text + "\n")
        return bag, str(meta), "'version'"
    if kind == "no metadata":
        meta.unlink()
        return bag, str(bag), "no metadata.yaml"
    raise AssertionError(kind)


KINDS = [
    "truncated mcap",
    "empty mcap",
    "not mcap",
    "truncated mcap file",
    "mcap of 8 bytes",
    "truncated sqlite",
    "not sqlite",
    "empty sqlite",
    "metadata not yaml",
    "metadata nested too deep",
    "metadata not a mapping",
    "metadata missing a key",
    "no metadata",
]


@pytest.mark.parametrize("kind", KINDS)
def test_bag_info_on_a_broken_bag_says_which_file_and_what_in_one_line(kind, good_bags, tmp_path, capsys):
    path, file, words = broken_bag(kind, good_bags, tmp_path)
    assert main(["bag", "info", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"mstar-ros bag info: error: {file}:"), err
    assert words in err, err


@pytest.mark.parametrize("kind", ["truncated mcap", "metadata not yaml", "truncated sqlite"])
def test_bag_play_on_a_broken_bag_says_which_file_and_what_in_one_line(kind, good_bags, tmp_path, capsys):
    path, file, words = broken_bag(kind, good_bags, tmp_path)
    assert main(["bag", "play", str(path), "--no-wait"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"mstar-ros bag play: error: {file}:") and words in err, err


def test_a_good_bag_is_still_described(good_bags, capsys):
    for bag in good_bags.values():
        assert main(["bag", "info", str(bag)]) == 0
        assert "messages:    120" in capsys.readouterr().out  # 2 s: 15 Hz x 2 cameras + 30 Hz joints


@pytest.mark.parametrize(
    "at, byte, words",
    [
        (0.4, b"\x00", "unreadable after "),  # zstd: data corruption
        (0.5, b"\xff", "could be read"),
    ],
)  # the parser skips messages
def test_a_chunk_corrupt_mid_file_stops_play_after_the_summary_with_one_line(
    at, byte, words, good_bags, tmp_path, ros_env
):
    """The index at the end is intact (info reads it), a compressed chunk in the middle is not: play
    publishes what it could read, prints its summary, then names the file and exits 2 -- also where the
    parser itself would skip the broken messages without a word."""
    bag, file = _copy(good_bags["mcap"], tmp_path / "bag")
    data = bytearray(file.read_bytes())
    start = int(len(data) * at)
    data[start : start + 64] = byte * 64
    file.write_bytes(bytes(data))
    info = subprocess.run(
        [sys.executable, "-m", "mstar_ros.cli", "bag", "info", str(bag)],
        capture_output=True,
        text=True,
        env=ros_env,
        timeout=120,
    )
    assert info.returncode == 0, info.stderr
    played = subprocess.run(
        [
            sys.executable,
            "-m",
            "mstar_ros.cli",
            "bag",
            "play",
            str(bag),
            "--no-wait",
            "--rate",
            "20",
            "--progress",
            "0",
        ],
        capture_output=True,
        text=True,
        env=ros_env,
        timeout=120,
    )
    assert played.returncode == 2, played.stdout + played.stderr
    assert "Traceback" not in played.stderr and len(played.stderr.strip().splitlines()) == 1, played.stderr
    assert played.stderr.startswith(f"mstar-ros bag play: error: {file}:") and words in played.stderr, played.stderr
    assert "stopped: published" in played.stdout  # what was published before it, as after Ctrl-C
