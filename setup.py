"""mstar_ros: Walk Graph serving runtime (M*) with ROS 2 and WebRTC front-ends.

The three source folders are mapped to import names that do not collide with
common names: runtime/ -> ``mstar``, graphs/ -> ``mstar_graphs``,
mstar_ros/ -> ``mstar_ros``.
"""

import os
from glob import glob

from setuptools import find_packages, setup

# isort: split
from distutils.command.install_data import install_data  # setuptools' own distutils, as setuptools is imported first

PACKAGE_DIRS = {"mstar": "runtime", "mstar_graphs": "graphs", "mstar_ros": "mstar_ros"}

# <prefix>/lib/mstar_ros/NAME runs <prefix>/bin/NAME: the console script, whose first line pip
# writes with the Python of the prefix it installs into
_LAUNCHER = """#!/bin/sh
# mstar_ros: launch_ros (Node(package="mstar_ros", executable="{name}")) and `ros2 run` start
# <prefix>/lib/mstar_ros/{name}; the program is the console script <prefix>/bin/{name}.
exec "$(dirname "$(readlink -f "$0")")/../../bin/{name}" "$@"
"""


class install_data_and_ros_executables(install_data):
    """data_files, plus, for each console script, a launcher in <prefix>/lib/mstar_ros/.

    launch_ros finds a Node's executable only in <prefix>/lib/<package>/. A wheel (what
    ``pip install .`` builds) can put console scripts only in <prefix>/bin/, the one place
    where the installer writes the prefix's own Python into them; anything else it copies
    as data, byte for byte. So lib/mstar_ros/ gets small launchers that run the bin/ script
    beside them: the right Python in a venv, a --prefix or --user install alike. colcon
    (setup.cfg: install_scripts=$base/lib/mstar_ros) installs the console scripts there
    itself, and then no launchers are made.
    """

    def run(self) -> None:
        install = self.get_finalized_command("install")
        lib_dir = os.path.join(self.install_dir, "lib", "mstar_ros")
        if os.path.normpath(install.install_scripts) != os.path.normpath(lib_dir):
            self.data_files = list(self.data_files) + [("lib/mstar_ros", self._write_launchers())]
        super().run()

    def _write_launchers(self) -> list[str]:
        out_dir = os.path.join(self.get_finalized_command("build").build_base, "ros_launchers")
        os.makedirs(out_dir, exist_ok=True)
        paths = []
        for entry in self.distribution.entry_points["console_scripts"]:
            name = entry.split("=", 1)[0].strip()
            path = os.path.join(out_dir, name)
            with open(path, "w") as f:
                f.write(_LAUNCHER.format(name=name))
            os.chmod(path, 0o755)  # copied with its mode; the wheel keeps it executable
            paths.append(path)
        return paths


def _packages() -> list[str]:
    found: list[str] = []
    for name, folder in PACKAGE_DIRS.items():
        found.append(name)
        found += [f"{name}.{sub}" for sub in find_packages(folder)]
    return found


setup(
    name="mstar_ros",
    version="0.1.0",
    packages=_packages(),
    package_dir=PACKAGE_DIRS,
    package_data={
        "mstar_ros": ["webrtc/static/*.html", "webrtc/static/*.js", "webrtc/static/*.css"]
    },  # the voice page (/)
    # ament_python layout: `ros2 launch mstar_ros pi05.launch.py` finds launch files and
    # config under <prefix>/share/mstar_ros, the package through the ament resource index
    data_files=[
        ("share/ament_index/resource_index/packages", ["resource/mstar_ros"]),
        ("share/mstar_ros", ["package.xml"]),
        ("share/mstar_ros/launch", sorted(glob("launch/*.launch.py"))),
        ("share/mstar_ros/config", sorted(glob("config/*.yaml") + glob("config/*.xml"))),
        ("share/mstar_ros/config/placement", sorted(glob("config/placement/*.yaml"))),
    ],
    python_requires=">=3.10",
    install_requires=[
        "torch==2.13.0",
        "msgspec>=0.18",
        "pyyaml>=6",
        "safetensors>=0.4",
        "tokenizers>=0.15",
        # PaliGemma's tokenizer as openpi ships it (paligemma_tokenizer.model, a SentencePiece model)
        "sentencepiece>=0.2",
        # frames that are not the model's size, resized as openpi's training pipeline does (PIL bilinear);
        # Qwen3-Omni images (PIL bicubic, as the Qwen2-VL image processor)
        "pillow>=10",
        "numpy>=1.24",
        "tqdm>=4.60",
    ],
    extras_require={
        "audio": ["snac==1.2.1"],
        # ROS 2 Kilted from PyPI (no /opt/ros): rclpy needs its [fastrtps] extra to import; pinned,
        # never mixed with ros-jazzy-*. rosbags reads/writes rosbag2 (MCAP, sqlite3) in pure Python.
        # rosgraph-msgs: /clock (bag play --clock); posix-ipc: Fast DDS port mutexes (mstar_ros.bag.shm_ports)
        "ros": [
            "ros-kilted-rclpy[fastrtps]==9.1.2",
            "ros-kilted-sensor-msgs==5.5.1",
            "ros-kilted-std-msgs==5.5.1",
            "ros-kilted-geometry-msgs==5.5.1",
            "ros-kilted-trajectory-msgs==5.5.1",
            "ros-kilted-diagnostic-msgs==5.5.1",
            "ros-kilted-nav-msgs==5.5.1",
            "ros-kilted-rosgraph-msgs==2.3.0",
            "rosbags==0.11.9",
            "posix-ipc==1.3.2",
        ],
        # silero-vad: the voice activity detector of a peer's microphone (its wheel ships the model)
        "webrtc": ["aiortc==1.16.0", "av==18.1.0", "aiohttp==3.14.5", "silero-vad==6.2.3"],
        "gpu": ["flashinfer-python==0.6.13", "flashinfer-cubin==0.6.13"],
        # optional cross-host tensor transport (CPU build; needs Debian libibverbs1)
        "mooncake": ["mooncake-transfer-engine-non-cuda==0.3.13.post1"],
        # llama-cpp-python (built from its sdist: llama.cpp compiled for this CPU) and gguf: `bench decode`'s
        # llama.cpp baseline and the GGUF export of our checkpoint
        "bench": [
            "matplotlib>=3.7",
            "transformers>=5.0,<6",
            "snac==1.2.1",
            "llama-cpp-python==0.3.36",
            "gguf==0.19.0",
        ],
        # setuptools: the install-layout test builds this package with --no-build-isolation (bdist_wheel
        # is part of setuptools since 70.1)
        # playwright drives Debian's chromium (make test installs it; never a downloaded browser)
        # openai: the official client, against the gateway's OpenAI-compatible routes
        # ruff: lint and format (`make lint`, run by `make test`)
        "test": [
            "pytest>=8",
            "pytest-timeout>=2",
            "playwright==1.65.2",
            "transformers>=5.0,<6",
            "snac==1.2.1",
            "matplotlib>=3.7",
            "setuptools>=70.1",
            "openai==3.63.0",
            "ruff==0.17.6",
        ],
    },
    # console scripts: with pip in bin/ and, as launchers, in lib/mstar_ros/ (install_data above);
    # with colcon in lib/mstar_ros/ (setup.cfg), where launch_ros.actions.Node(package="mstar_ros",
    # executable=...) looks for them
    cmdclass={"install_data": install_data_and_ros_executables},
    entry_points={
        "console_scripts": [
            "mstar-ros = mstar_ros.cli:main",
            "mstar_pi05_node_set = mstar_ros.ros.pi05.node_set:main",
            "mstar_orpheus_node = mstar_ros.ros.orpheus.node_set:main",
            "mstar_vjepa2_node_set = mstar_ros.ros.vjepa2.node_set:main",
            "mstar_bagel_node_set = mstar_ros.ros.bagel.node_set:main",
            "mstar_edge_host = mstar_ros.edge.host:main",
        ],
        # what a Worker may build, by name (mstar.worker.registry): never code a peer names
        "mstar.models": [
            "orpheus = mstar_graphs.orpheus.components:orpheus_components",
            "pi05 = mstar_graphs.pi05.components:pi05_components",
            "vjepa2 = mstar_graphs.vjepa2.components:vjepa2_components",
            "qwen3_omni = mstar_graphs.qwen3_omni.components:qwen3_omni_components",
            "bagel = mstar_graphs.bagel.components:bagel_components",
        ],
        "mstar.worker_plugins": ["ros_diagnostics = mstar_ros.ros.common.worker_diagnostics:attach"],
        # what the WebRTC gateway can serve, by name (mstar_ros.webrtc.speech_models)
        "mstar.speech_models": [
            "orpheus = mstar_graphs.orpheus.frontend:OrpheusTTS",
            "qwen3-omni = mstar_graphs.qwen3_omni.frontend:Qwen3OmniChat",
            "bagel = mstar_graphs.bagel.frontend:BagelModel",
        ],
    },
    zip_safe=True,
    maintainer="mstar_ros developers",
    description="Walk Graph serving runtime for composite multimodal models, as ROS 2 nodes",
    license="Apache-2.0",
)
