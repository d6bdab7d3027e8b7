"""setup.py: `pip install .` (and colcon's `setup.py install`) put every file where ament and launch_ros look.

The package is installed for real, from a copy of this tree, into temporary prefixes with this
venv's setuptools (--no-build-isolation: offline, a few seconds). What is checked is what
`ros2 launch mstar_ros pi05.launch.py` needs (read from the launch / launch_ros / ament_index
code): the ament index marker share/ament_index/resource_index/packages/mstar_ros under a
prefix on AMENT_PREFIX_PATH; launch files, config and package.xml in <prefix>/share/mstar_ros/;
and each Node's executable in <prefix>/lib/mstar_ros/ (launch_ros' ExecutableInPackage:
`which(executable, path=<get_package_prefix(package)>/lib/<package>)`), executable, running.
"""

from __future__ import annotations

import configparser
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from support.launch_standins import describe, load_launch_file, nodes

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from install_ros_layout import NOT_COPIED  # noqa: E402  (what a build of this tree leaves out)

SHARE_FILES = [
    "package.xml",
    "launch/pi05.launch.py",
    "launch/orpheus.launch.py",
    "launch/vjepa2.launch.py",
    "launch/bagel.launch.py",
    "launch/bagel_vjepa2.launch.py",
    "launch/edge.launch.py",
    "config/pi05.yaml",
    "config/bagel.yaml",
    "config/engine.yaml",
    "config/edge.yaml",
    "config/engine_voice.yaml",  # edge.yaml's voice engine settings, found beside it
    "config/fastdds_localhost.xml",
]


def _copy_of_the_tree(dest: Path) -> Path:
    shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(*NOT_COPIED))
    return dest


def _this_venvs_install() -> list[str]:
    """This environment's own install of the project (the editable one the tests import)."""
    return sorted(p.name for d in map(Path, site.getsitepackages()) if d.is_dir() for p in d.glob("*mstar_ros*"))


@pytest.fixture(scope="module")
def prefix(tmp_path_factory) -> Path:
    """`pip install .` into a fresh --prefix."""
    tmp = tmp_path_factory.mktemp("pip_install")
    src = _copy_of_the_tree(tmp / "src")
    before = _this_venvs_install()
    # --ignore-installed: without it pip first uninstalls the project from the environment it runs in
    # (this venv's editable install), even though it installs into another prefix
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--ignore-installed",
            "--no-compile",
            "--prefix",
            str(tmp / "prefix"),
            str(src),
        ],
        check=True,
        timeout=180,
    )
    assert _this_venvs_install() == before
    return tmp / "prefix"


def _site_packages(prefix: Path) -> Path:
    (site,) = prefix.glob("lib/python3*/site-packages")
    return site


def _console_scripts(prefix: Path) -> list[str]:
    (entry_points,) = _site_packages(prefix).glob("mstar_ros-*.dist-info/entry_points.txt")
    parser = configparser.ConfigParser()
    parser.read(entry_points)
    return sorted(parser["console_scripts"])


def _installed_env(prefix: Path, **more: str) -> dict[str, str]:
    """The installed copy first on the path (before this venv's editable install of the working tree)."""
    env = {k: v for k, v in os.environ.items() if k != "AMENT_PREFIX_PATH"}
    return {**env, "PYTHONPATH": str(_site_packages(prefix)), **more}


def test_pip_install_puts_the_ros_files_in_share_and_the_ament_marker(prefix):
    share = prefix / "share" / "mstar_ros"
    for rel in SHARE_FILES:
        assert (share / rel).read_bytes() == (ROOT / rel).read_bytes(), rel
    placements = sorted(p.name for p in (ROOT / "config" / "placement").glob("*.yaml"))
    assert placements and sorted(p.name for p in (share / "config" / "placement").iterdir()) == placements
    assert (prefix / "share" / "ament_index" / "resource_index" / "packages" / "mstar_ros").is_file()


def test_every_console_script_is_on_path_and_in_lib_mstar_ros_and_runs_from_there(prefix, tmp_path):
    scripts = _console_scripts(prefix)
    assert {
        "mstar-ros",
        "mstar_pi05_node_set",
        "mstar_orpheus_node",
        "mstar_vjepa2_node_set",
        "mstar_bagel_node_set",
        "mstar_edge_host",
    } <= set(scripts)
    for name in scripts:
        for where in (prefix / "bin", prefix / "lib" / "mstar_ros"):
            assert shutil.which(name, path=str(where)) == str(where / name), f"{where}/{name} is not executable"
        # as launch_ros runs it: by its path, from elsewhere; it runs the prefix's own console script
        out = subprocess.run(
            [str(prefix / "lib" / "mstar_ros" / name), "--help"],
            cwd=tmp_path,
            env=_installed_env(prefix),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0 and "usage:" in out.stdout, (name, out.stdout, out.stderr)
    imported = subprocess.run(
        [
            sys.executable,
            "-c",
            "import mstar_ros, mstar, mstar_graphs; print(mstar_ros.__file__, mstar.__file__, mstar_graphs.__file__)",
        ],
        cwd=tmp_path,
        env=_installed_env(prefix),
        capture_output=True,
        text=True,
        check=True,
    )
    assert all(p.startswith(str(_site_packages(prefix))) for p in imported.stdout.split()), imported.stdout


def test_ament_finds_the_package_and_launch_ros_the_launch_files_executables(prefix, monkeypatch):
    from ament_index_python import get_resource
    from ament_index_python.packages import get_package_prefix, get_package_share_directory

    monkeypatch.setenv("AMENT_PREFIX_PATH", str(prefix))
    assert get_package_share_directory("mstar_ros") == str(prefix / "share" / "mstar_ros")
    assert get_resource("packages", "mstar_ros") == ("", str(prefix))
    libexec = Path(get_package_prefix("mstar_ros")) / "lib" / "mstar_ros"
    for launch_file in (
        "pi05.launch.py",
        "orpheus.launch.py",
        "vjepa2.launch.py",
        "bagel.launch.py",
        "bagel_vjepa2.launch.py",
        "edge.launch.py",
    ):  # the installed files, as ros2 launch loads them
        _declared, entities = describe(
            load_launch_file(prefix / "share" / "mstar_ros" / "launch" / launch_file, monkeypatch), {}
        )
        for node in nodes(entities):
            assert node.kwargs["package"] == "mstar_ros"
            assert shutil.which(node.kwargs["executable"], path=str(libexec)) == str(
                libexec / node.kwargs["executable"]
            )


def test_the_installed_package_finds_its_config_in_share(prefix, tmp_path):
    """Outside the source tree, with no AMENT_PREFIX_PATH: the params file and the Fast DDS profile come from
    <prefix>/share/mstar_ros/config/ (and through the ament index when it names the prefix)."""
    probe = (
        "from mstar_ros.bag.ros_env import apply_localhost_defaults; from mstar_ros.launch_spec import "
        "default_params_file; env = {}; apply_localhost_defaults(env); "
        "print(default_params_file()); print(env['FASTDDS_DEFAULT_PROFILES_FILE'])"
    )
    config = prefix / "share" / "mstar_ros" / "config"
    for more in ({}, {"AMENT_PREFIX_PATH": str(prefix)}):
        out = subprocess.run(
            [sys.executable, "-c", probe],
            cwd=tmp_path,
            env=_installed_env(prefix, **more),
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.split() == [str(config / "pi05.yaml"), str(config / "fastdds_localhost.xml")], more


def test_colcon_install_puts_the_console_scripts_themselves_in_lib_mstar_ros(tmp_path):
    """What colcon runs for an ament_python package (`setup.py install` with setup.cfg's install_scripts
    on the command line): the real console scripts in lib/mstar_ros/, no launchers over them, data files."""
    src = _copy_of_the_tree(tmp_path / "src")
    prefix = tmp_path / "install"
    site = prefix / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    site.mkdir(parents=True)
    (tmp_path / "egg").mkdir()
    subprocess.run(
        [
            sys.executable,
            "setup.py",
            "-q",
            "egg_info",
            "--egg-base",
            str(tmp_path / "egg"),
            "build",
            "--build-base",
            str(tmp_path / "build"),
            "install",
            "--prefix",
            str(prefix),
            "--record",
            str(tmp_path / "install.log"),
            "--install-scripts",
            "$base/lib/mstar_ros",
            "--single-version-externally-managed",
            "install_data",
        ],
        cwd=src,
        env={**os.environ, "PYTHONPATH": str(site)},
        check=True,
        capture_output=True,
        timeout=180,
    )
    lib = prefix / "lib" / "mstar_ros"
    assert sorted(p.name for p in lib.iterdir()) == [
        "mstar-ros",
        "mstar_bagel_node_set",
        "mstar_edge_host",
        "mstar_orpheus_node",
        "mstar_pi05_node_set",
        "mstar_vjepa2_node_set",
    ]
    for exe in lib.iterdir():
        assert exe.read_text().startswith("#!" + sys.executable) and os.access(exe, os.X_OK), exe
    assert not (prefix / "bin").exists()
    for rel in SHARE_FILES:
        assert (prefix / "share" / "mstar_ros" / rel).is_file(), rel
