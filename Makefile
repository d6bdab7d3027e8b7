# The two commands: `make demo` and `make test` do all set-up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PIP := $(VENV)/bin/pip
ARGS ?=
PYTEST_ARGS ?=
# Loopback-only network namespace when we can make one (root): nothing leaves 127.0.0.1.
NETNS := $(shell [ "$$(id -u)" = 0 ] && unshare -n true 2>/dev/null && echo yes)
# ROS 2 DDS discovery stays on this host unless a user widens it explicitly (every mstar_ros
# process also applies its localhost defaults itself: mstar_ros/bag/ros_env.py).
export ROS_AUTOMATIC_DISCOVERY_RANGE ?= LOCALHOST
# what `pip install .` puts where ROS 2 looks, from these files (setup.py's data_files)
ROS_FILES := package.xml resource/mstar_ros $(wildcard launch/*.launch.py config/*.yaml config/*.xml config/placement/*.yaml)

.PHONY: demo test lint install install-test clean

$(VENV)/.installed: setup.py
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first and pinned: the CPU wheel; an unpinned torch would pull a multi-GB CUDA build
	$(PIP) install -q torch==2.13.0
	# the ros extra: ROS 2 from PyPI (rclpy, messages, rosbags) for the pi0.5 node set of `make demo`.
	# Editable: tests and the demo run the working tree's code
	$(PIP) install -q -e ".[audio,ros]"
	touch $@

# An editable install writes no data files: add the ones `pip install .` installs (lib/mstar_ros/
# executables, share/mstar_ros/ launch files, config and package.xml, the ament index marker), so that
# `AMENT_PREFIX_PATH=$(VENV) ros2 launch mstar_ros pi05.launch.py` finds the package in this venv
$(VENV)/.ros-layout: $(VENV)/.installed $(ROS_FILES)
	$(VENV)/bin/python tools/install_ros_layout.py --prefix $(VENV)
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	# Mooncake (the mooncake extra; its tests run, never skip) needs Debian's libibverbs1
	@if [ "$$(id -u)" = 0 ] && ! ldconfig -p | grep -q 'libibverbs\.so\.1 '; then \
		apt-get install -y -q libibverbs1 || { apt-get update -q && apt-get install -y -q libibverbs1; }; fi
	# the WebRTC tests drive Debian's chromium with playwright (never a downloaded browser) and Debian's
	# firefox-esr over WebDriver BiDi (its sound card a private pulseaudio null sink), and speak into the
	# microphone path with espeak-ng (real speech a VAD detects)
	@if [ "$$(id -u)" = 0 ] && ! { command -v chromium && command -v firefox-esr && command -v pulseaudio \
			&& command -v espeak-ng; } >/dev/null; then \
		apt-get install -y -q chromium firefox-esr pulseaudio espeak-ng || { apt-get update -q \
			&& apt-get install -y -q chromium firefox-esr pulseaudio espeak-ng; }; fi
	# llama-cpp-python (the bench extra: `bench decode`'s baseline) has no wheel on PyPI: its sdist compiles
	# llama.cpp, which needs a C++ compiler and cmake
	@if [ "$$(id -u)" = 0 ] && ! { command -v g++ && command -v cmake; } >/dev/null; then \
		apt-get install -y -q g++ cmake || { apt-get update -q && apt-get install -y -q g++ cmake; }; fi
	# the ros extra too: the ROS 2 tests (real rclpy over DDS, bag playback) run, never skip
	PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 $(PIP) install -q -e ".[audio,bench,test,mooncake,ros,webrtc]"
	touch $@

install: $(VENV)/.ros-layout
install-test: $(VENV)/.installed-test

# the pi0.5 node set serving two robots from the bundled synthetic bag for ~20 s, localhost only;
# `make demo ARGS=--forever` serves until Ctrl-C
demo: $(VENV)/.ros-layout
	$(VENV)/bin/mstar-ros demo $(ARGS)

test: $(VENV)/.installed-test lint
ifeq ($(NETNS),yes)
	unshare -n sh -c 'ip link set lo up && $(VENV)/bin/python -m pytest -q $(PYTEST_ARGS)'
else
	@echo "note: not root or no unshare: running tests without a loopback-only namespace"
	$(VENV)/bin/python -m pytest -q $(PYTEST_ARGS)
endif

# ruff.toml: lint and format; `ruff format .` fixes what the format check reports
lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) out build *.egg-info
