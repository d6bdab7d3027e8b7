"""The gateway token: from a file or the environment (argv only with a warning), and the Authorization header."""

from __future__ import annotations

import logging

import pytest

from mstar_ros.webrtc.gateway_token import TOKEN_ENV, authorised, bearer_token, gateway_token


def test_the_token_comes_from_one_of_file_environment_or_argv_and_argv_warns(tmp_path, caplog):
    file = tmp_path / "token"
    file.write_text("s3cret\n")
    file.chmod(0o600)
    assert gateway_token(file=file, environ={}) == "s3cret"
    assert gateway_token(environ={TOKEN_ENV: "from-env"}) == "from-env"
    assert gateway_token(environ={}) is None
    with caplog.at_level(logging.WARNING, logger="mstar_ros.webrtc"):
        assert gateway_token("in-argv", environ={}) == "in-argv"
        file.chmod(0o644)
        gateway_token(file=file, environ={})
    said = [r.getMessage() for r in caplog.records]
    assert any("--token is visible to every user" in m for m in said)
    assert any("can be read by other users" in m for m in said)
    with pytest.raises(ValueError, match=r"given twice \(--token-file and \$MSTAR_GATEWAY_TOKEN\)"):
        gateway_token(file=file, environ={TOKEN_ENV: "x"})
    with pytest.raises(ValueError, match="--token-file .*missing: cannot read it"):
        gateway_token(file=tmp_path / "missing", environ={})
    for bad in ("  ", "two words", "caf\u00e9"):
        with pytest.raises(ValueError, match="non-empty printable ASCII"):
            gateway_token(environ={TOKEN_ENV: bad})


@pytest.mark.parametrize(
    "header, ok",
    [
        ("Bearer s3cret", True),
        ("bearer s3cret", True),
        ("BEARER  s3cret ", True),
        ("s3cret", False),
        ("Basic s3cret", False),
        ("Bearer", False),
        ("Bearer wrong", False),
        ("", False),
        ("Bearer s3cr\udce9t", False),  # aiohttp's view of a header with a byte that is not UTF-8
        ("Bearer s3cr\u00e9t", False),
    ],
)
def test_only_bearer_with_the_token_is_authorised_in_any_case_of_the_scheme(header, ok):
    assert authorised(header, "s3cret") is ok
    assert (bearer_token(header) is not None) == (
        header.strip().lower().startswith("bearer ") and bool(header.strip()[7:].strip())
    )
