"""``mstar-ros serve voice`` as a process: the URLs it prints work, it stops on SIGINT when a script started it
as a background job (SIGINT ignored) and on SIGTERM, and ``--model`` lists the installed speech models."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import urllib.request

import pytest

from mstar_ros.webrtc.speech_models import speech_model_names

SERVE = [sys.executable, "-m", "mstar_ros.cli", "serve", "voice", "--port", "0"]


def _started(proc: subprocess.Popen) -> list[str]:
    """The lines it printed up to its dtype line (the last of its banner)."""
    seen = []
    for line in proc.stdout:  # type: ignore[union-attr]
        seen.append(line)
        if line.startswith("  dtype "):
            return seen
    raise AssertionError(f"serve voice exited {proc.wait()}: {''.join(seen)[-3000:]}")


def _get(url: str, token: str | None = None) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=30) as r:
        return r.status


@pytest.mark.timeout(180)
def test_a_background_job_stops_on_sigint_and_prints_its_urls_but_never_its_token(tmp_path):
    """``sh -c 'serve voice &'``: the shell starts the job with SIGINT ignored, so Python never raises
    KeyboardInterrupt; SIGINT still stops it, exit status 0, with its closing log line."""
    probe = subprocess.run(
        [
            "sh",
            "-c",
            '"$@" & wait $!',
            "sh",
            sys.executable,
            "-c",
            "import signal; print(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.stdout.strip() == "True", probe  # what a job started this way inherits
    token = "tok-" + "x7" * 12
    (tmp_path / "token").write_text(token)
    proc = subprocess.Popen(
        ["sh", "-c", '"$@" & echo "pid $!"; wait $!', "sh", *SERVE, "--token-file", str(tmp_path / "token")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        server = int(proc.stdout.readline().split()[1])  # type: ignore[union-attr]
        banner = "".join(_started(proc))
        base = re.search(r"POST (http://127\.0\.0\.1:\d+)/offer", banner).group(1)
        pages = (_get(f"{base}/"), _get(f"{base}/v1/models", token))
        subprocess.run(["kill", "-INT", str(server)], check=True)
        rest, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert f"  page: {base}/#token=YOUR_TOKEN" in banner and f"  WHIP: POST {base}/whip" in banner
    assert f"  OpenAI base URL: {base}/v1" in banner
    assert token not in banner + rest
    assert pages == (200, 200)
    assert proc.returncode == 0 and "stopping: closing 0 peer(s)" in rest, rest


@pytest.mark.timeout(180)
def test_sigterm_stops_it_with_its_closing_line_and_exit_status_0():
    proc = subprocess.Popen(SERVE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        banner = "".join(_started(proc))
        base = re.search(r"POST (http://127\.0\.0\.1:\d+)/offer", banner).group(1)
        assert f"  page: {base}/\n" in banner
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "stopping: closing 0 peer(s)" in rest, rest


def test_model_lists_the_installed_speech_models_as_its_choices():
    names = speech_model_names()
    assert "orpheus" in names
    shown = subprocess.run(SERVE + ["--help"], capture_output=True, text=True, timeout=60)
    assert f"--model {{{','.join(names)}}}" in shown.stdout, shown.stdout
    wrong = subprocess.run(SERVE + ["--model", "nope"], capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and "invalid choice: 'nope'" in wrong.stderr
    assert all(repr(name) in wrong.stderr for name in names), wrong.stderr
