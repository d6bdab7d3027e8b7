"""Give an editable install the files `pip install .` puts where ROS 2 looks.

    python tools/install_ros_layout.py [--prefix PREFIX] [--no-build-isolation]

``make`` installs this package editable (``pip install -e``), so that tests and the demo run
the working tree's code. An editable install writes no data files, so ``ros2 launch mstar_ros
...`` would not find the package there. This builds the wheel that ``pip install .`` would
install (from a copy of the tree, leaving no build/ behind) and copies its data files into
PREFIX, as colcon's --symlink-install does beside its develop install:

  lib/mstar_ros/<console script>   launchers of the bin/ console scripts, where launch_ros looks
  share/mstar_ros/                 package.xml, launch/*.launch.py, config/ (placement/, Fast DDS profile)
  share/ament_index/resource_index/packages/mstar_ros   the ament index marker

The Python code stays editable; these files are copies (``make`` copies them again when one
changes). pip does not record them: uninstalling the editable install leaves them.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: not part of the package's build; the copy leaves them out (a venv is large, build/ is stale)
NOT_COPIED = (
    ".git",
    ".venv*",
    "build",
    "dist",
    "out",
    "*.egg-info",
    "__pycache__",
    ".cache",
    ".pytest_cache",
    "test",
    "docs",
    ".whl",
)


def build_wheel(source: Path, out_dir: Path, *, isolation: bool = True) -> Path:
    """The wheel of ``source`` as ``pip install`` builds it (from a copy of the tree)."""
    with tempfile.TemporaryDirectory(prefix="mstar-ros-layout-") as tmp:
        copy = Path(tmp) / "src"
        shutil.copytree(source, copy, ignore=shutil.ignore_patterns(*NOT_COPIED))
        cmd = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out_dir), str(copy)]
        if not isolation:
            cmd.insert(4, "--no-build-isolation")
        subprocess.run(cmd, check=True)
    (wheel,) = out_dir.glob("mstar_ros-*.whl")
    return wheel


def install_data(wheel: Path, prefix: Path) -> list[Path]:
    """Copies the wheel's ``*.data/data/`` files into ``prefix`` (an installer's job for data files),
    executable where the wheel says so. Returns the files written."""
    written = []
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            head, _, rel = info.filename.partition(".data/data/")
            if not rel or "/" in head or info.is_dir():
                continue
            dest = prefix / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(dest, "wb") as out:
                shutil.copyfileobj(src, out)
            executable = (info.external_attr >> 16) & 0o111
            dest.chmod(0o755 if executable else 0o644)
            written.append(dest)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--prefix",
        type=Path,
        default=Path(sys.prefix),
        help="install prefix, e.g. the venv (default: this Python's, %(default)s)",
    )
    parser.add_argument("--source", type=Path, default=ROOT, help="the project tree (default: %(default)s)")
    parser.add_argument(
        "--no-build-isolation",
        dest="isolation",
        action="store_false",
        help="build with this environment's setuptools instead of a fresh one from the index",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mstar-ros-wheel-") as out:
        wheel = build_wheel(args.source, Path(out), isolation=args.isolation)
        written = install_data(wheel, args.prefix)
    lib = sorted(p.name for p in written if p.parent.name == "mstar_ros" and p.parent.parent.name == "lib")
    print(
        f"installed {len(written)} files under {args.prefix}: lib/mstar_ros/ ({', '.join(lib)}), "
        "share/mstar_ros/, the ament index marker"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
