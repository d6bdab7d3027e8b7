"""Opening and reading a rosbag2 with ``rosbags``, where a broken bag is one line naming the file.

A truncated, corrupt or empty MCAP or SQLite file, or a broken ``metadata.yaml``, makes rosbags raise
whatever its parser met (``ReaderError``, a zstd error, even ``TypeError``), often without saying which
file. Here every such failure becomes one :class:`BagError` that names the file and says what is wrong
in plain words. Only the reading is wrapped (opening, and the message iterator), so a bug elsewhere is
never mistaken for a broken bag.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from mstar.user_yaml import UserYamlError, load_user_yaml_file

METADATA = "metadata.yaml"
STORAGE_SUFFIXES = (".mcap", ".db3")

# rosbags' words for the common cases -> what the user is told
_PLAIN_WORDS = (
    ("seems to be empty", "empty file (0 bytes)"),
    ("database missing tables", "empty or not a rosbag2 SQLite database (no rosbag2 tables)"),
    ("File end magic is invalid", "truncated MCAP: the file ends before its footer (a recording cut off?)"),
    ("Truncated record", "truncated MCAP"),
    ("File magic is invalid", "not an MCAP file (it does not start with the MCAP magic bytes)"),
    ("database disk image is malformed", "corrupt or truncated SQLite database"),
    ("file is not a database", "not a SQLite database"),
)


class BagError(ValueError):
    """A bag that cannot be read; the message names the file and what is wrong (one line)."""


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def _plain(exc: BaseException, file: Path) -> str:
    said = one_line(str(exc)) or type(exc).__name__
    for found, words in _PLAIN_WORDS:
        if found in said:
            return words
    if type(exc).__name__ not in ("ReaderError", "AnyReaderError"):
        said = f"{type(exc).__name__}: {said}"  # a parser's own failure: say which, for a bug report
        if file.suffix in STORAGE_SUFFIXES:
            return f"corrupt or truncated {'MCAP' if file.suffix == '.mcap' else 'SQLite'} file ({said})"
    return said


def read_metadata(bag: str | Path) -> dict[str, Any]:
    """``rosbag2_bagfile_information`` of a bag directory's metadata.yaml ({} for a single-file bag or a
    directory without one); a metadata.yaml that is no YAML mapping of that key is a :class:`BagError`."""
    meta = Path(bag) / METADATA
    if not Path(bag).is_dir() or not meta.exists():
        return {}
    try:
        doc = load_user_yaml_file(meta)  # aliases refused, nesting bounded; errors say FILE:LINE
    except UserYamlError as exc:
        raise BagError(str(exc)) from None
    except OSError as exc:
        raise BagError(f"{meta}: cannot be read: {one_line(exc)}") from None
    info = doc.get("rosbag2_bagfile_information") if isinstance(doc, dict) else None
    if not isinstance(info, dict):
        raise BagError(f"{meta}: not rosbag2 metadata (no rosbag2_bagfile_information mapping)")
    return info


def storage_files(bag: Path) -> list[Path]:
    """The storage files of a bag: the file itself, or a directory's MCAP / SQLite files."""
    if not bag.is_dir():
        return [bag]
    return sorted(p for p in bag.iterdir() if p.suffix in STORAGE_SUFFIXES and p.is_file())


def _first_broken_file(bag: Path) -> tuple[Path, BaseException] | None:
    """The first storage file of a directory bag that rosbags cannot open by itself (None: all open)."""
    from rosbags.rosbag2 import Reader

    for file in storage_files(bag):
        try:
            with Reader(file):
                pass
        except Exception as exc:  # whatever the parser met: the file is what is wrong
            return file, exc
    return None


def _open_error(bag: Path, exc: BaseException) -> BagError:
    if not bag.is_dir():
        return BagError(f"{bag}: {_plain(exc, bag)}")
    broken = _first_broken_file(bag)
    if broken is not None:
        return BagError(f"{broken[0]}: {_plain(broken[1], broken[0])}")
    # every storage file opens by itself: the metadata is what is wrong
    return BagError(f"{bag / METADATA}: {_plain(exc, bag / METADATA)}")


@contextlib.contextmanager
def open_bag(bag: str | Path) -> Iterator[Any]:
    """An open ``rosbags.rosbag2.Reader``; a missing path is FileNotFoundError, a broken bag BagError."""
    from rosbags.rosbag2 import Reader

    bag = Path(bag)
    if not bag.exists():
        raise FileNotFoundError(f"no bag at {bag}")
    if bag.is_dir() and not (bag / METADATA).exists():
        raise BagError(
            f"{bag}: no {METADATA}: not a rosbag2 directory (give the directory rosbag2 wrote, "
            f"or one of its .mcap / .db3 files)"
        )
    if not bag.is_dir() and bag.suffix not in STORAGE_SUFFIXES:
        raise BagError(f"{bag}: not a rosbag2 (a directory, or a .mcap / .db3 file)")
    read_metadata(bag)  # its own errors say the line
    reader = Reader(bag)
    try:
        reader.open()
    except Exception as exc:  # whatever the parser met
        raise _open_error(bag, exc) from None
    try:
        yield reader
    finally:
        reader.close()


def bag_messages(reader: Any, bag: str | Path, connections: Iterable[Any] | None = None) -> Iterator[tuple]:
    """``reader.messages(connections)``, where a failure while reading is a BagError naming the file and
    how many messages were read before it -- and so is reading fewer messages than the bag's index lists
    (a corrupt chunk can make the parser skip messages without a word)."""
    bag = Path(bag)
    connections = list(connections) if connections is not None else list(reader.connections)
    expected = sum(c.msgcount for c in connections)
    files = storage_files(bag)
    where = files[0] if len(files) == 1 else bag
    read = 0
    messages = reader.messages(connections=connections)
    while True:
        try:
            item = next(messages)
        except StopIteration:
            break
        except Exception as exc:  # whatever the parser met in the file
            raise BagError(f"{where}: unreadable after {read} messages: {_plain(exc, where)}") from None
        read += 1
        yield item
    if read < expected:
        raise BagError(
            f"{where}: only {read} of the {expected} messages its index lists could be read (a corrupt chunk?)"
        )
