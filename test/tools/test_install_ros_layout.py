"""tools/install_ros_layout.py: what `make` adds to the editable venv so that `ros2 launch` finds the package."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_it_installs_the_wheels_data_files_executable_where_ros_looks(tmp_path):
    prefix = tmp_path / "venv"
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "install_ros_layout.py"),
            "--prefix",
            str(prefix),
            "--no-build-isolation",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    assert (
        "lib/mstar_ros/ (mstar-ros, mstar_bagel_node_set, mstar_edge_host, mstar_orpheus_node, mstar_pi05_node_set, mstar_vjepa2_node_set)"
        in out.stdout
    )
    share = prefix / "share" / "mstar_ros"
    for rel in (
        "package.xml",
        "launch/pi05.launch.py",
        "launch/orpheus.launch.py",
        "config/pi05.yaml",
        "config/fastdds_localhost.xml",
        "config/placement/pi05-two-ranks.yaml",
    ):
        assert (share / rel).read_bytes() == (ROOT / rel).read_bytes(), rel
    assert (prefix / "share" / "ament_index" / "resource_index" / "packages" / "mstar_ros").is_file()
    for name in ("mstar-ros", "mstar_orpheus_node", "mstar_pi05_node_set", "mstar_vjepa2_node_set"):
        exe = prefix / "lib" / "mstar_ros" / name
        assert os.access(exe, os.X_OK) and f'/../../bin/{name}" "$@"' in exe.read_text()
    assert not os.access(share / "package.xml", os.X_OK)
    assert not (ROOT / "build" / "ros_launchers").exists()  # built from a copy of the tree


def test_the_launchers_run_the_venvs_console_script(tmp_path):
    """In a venv the launcher in lib/mstar_ros/ runs bin/NAME beside it (here a stand-in script)."""
    prefix = tmp_path / "venv"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "install_ros_layout.py"),
            "--prefix",
            str(prefix),
            "--no-build-isolation",
        ],
        check=True,
        capture_output=True,
        timeout=180,
    )
    (prefix / "bin").mkdir()
    script = prefix / "bin" / "mstar_pi05_node_set"
    script.write_text('#!/bin/sh\necho "bin script: $*"\n')
    script.chmod(0o755)
    link = tmp_path / "elsewhere"
    link.symlink_to(prefix / "lib" / "mstar_ros" / "mstar_pi05_node_set")  # through a symlink as well
    for exe in (prefix / "lib" / "mstar_ros" / "mstar_pi05_node_set", link):
        out = subprocess.run([str(exe), "--robots", "/a b"], capture_output=True, text=True, timeout=30, cwd="/")
        assert out.stdout == "bin script: --robots /a b\n", out
