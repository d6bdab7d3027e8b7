"""The command line as a user runs it (a real subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
import wave

import pytest

CLI = [sys.executable, "-m", "mstar_ros.cli"]


def run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ})


def test_help_explains_commands():
    out = run("--help")
    assert out.returncode == 0
    assert "tts" in out.stdout and "bench" in out.stdout and "RANDOM" in out.stdout
    tts_help = run("tts", "--help")
    assert "--weights" in tts_help.stdout and "--snac-weights" in tts_help.stdout


def test_tts_writes_a_wav_and_reports(tmp_path):
    wav = tmp_path / "speech.wav"
    out = run("tts", "--text", "Hello robot.", "--out", str(wav), "--seed", "1", "--max-tokens", "63")
    assert out.returncode == 0, out.stderr
    assert "time to first audio" in out.stdout and "RTF" in out.stdout
    assert "RANDOM" in out.stdout
    with wave.open(str(wav)) as f:
        assert f.getframerate() == 24000 and f.getnchannels() == 1 and f.getsampwidth() == 2
        # 63 tokens = 9 frames of 2048 samples, all delivered (the edge frames too)
        assert f.getnframes() == 9 * 2048


@pytest.mark.slow
def test_tts_bad_input_exits_with_a_clear_error(tmp_path):
    out = run("tts", "--text", "  ", "--out", str(tmp_path / "x.wav"))
    assert out.returncode == 2 and "text is empty" in out.stderr
    out = run("tts", "--text", "hi", "--out", str(tmp_path / "x.wav"), "--weights", str(tmp_path / "none"))
    assert out.returncode == 2 and "config.json" in out.stderr
    bad = tmp_path / "engine.yaml"
    bad.write_text("max_batched_tokens: lots\n")
    out = run("tts", "--text", "hi", "--out", str(tmp_path / "x.wav"), "--engine-config", str(bad))
    assert out.returncode == 2 and "max_batched_tokens" in out.stderr
