"""What a process may build: names registered by installed packages or by whoever starts it, nothing else."""

from __future__ import annotations

import sys

import pytest

from mstar.worker import registry
from mstar.worker.registry import MODELS, PLUGINS, NotRegistered


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """An importable module that records being imported."""
    (tmp_path / "planted_mod.py").write_text(
        "import sys\nsys.planted_imported = True\ndef build(**kw):\n    return kw\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(MODELS.env, raising=False)
    yield "planted_mod"
    sys.modules.pop("planted_mod", None)
    if hasattr(sys, "planted_imported"):
        del sys.planted_imported


def test_installed_graph_packages_register_their_models_and_plugins_by_entry_point():
    assert registry.registered(MODELS)["pi05"] == "mstar_graphs.pi05.components:pi05_components"
    assert registry.registered(MODELS)["orpheus"] == "mstar_graphs.orpheus.components:orpheus_components"
    assert registry.registered(PLUGINS)["ros_diagnostics"] == "mstar_ros.ros.common.worker_diagnostics:attach"
    from mstar_graphs.pi05.components import pi05_components

    assert registry.resolve(MODELS, "pi05") is pi05_components


def test_a_module_function_name_is_refused_without_importing_it(planted):
    with pytest.raises(NotRegistered) as info:
        registry.resolve(MODELS, f"{planted}:build")
    assert not hasattr(sys, "planted_imported") and planted not in sys.modules
    message = str(info.value)
    assert message.startswith(
        f"model '{planted}:build' is not registered in this process (a module:function is "
        "never imported from a message); registered: "
    )
    assert "pi05" in message and "'mstar.models'" in message and "MSTAR_MODELS=NAME=module:function" in message


def test_the_environment_of_the_process_registers_local_models(planted, monkeypatch):
    monkeypatch.setenv(MODELS.env, f" local = {planted}:build , other={planted}:build")
    assert registry.registered(MODELS)["local"] == f"{planted}:build"
    assert registry.resolve(MODELS, "local")(x=1) == {"x": 1}
    assert sys.planted_imported


def test_a_name_registered_twice_with_different_targets_is_an_error(planted, monkeypatch):
    monkeypatch.setenv(MODELS.env, f"pi05={planted}:build")
    with pytest.raises(
        ValueError,
        match=f"model 'pi05' is registered with different targets: "
        f"mstar_graphs.pi05.components:pi05_components, {planted}:build",
    ):
        registry.resolve(MODELS, "pi05")
    assert not hasattr(sys, "planted_imported")


@pytest.mark.parametrize(
    "text, error",
    [
        ("nameonly", "expected NAME=module:function, got 'nameonly'"),
        ("bad name=m:f", "model name 'bad name' must be letters"),
        ("x=os.system", "model 'x' must name a module:function, got 'os.system'"),
        ("x=m:f; rm -rf", "must name a module:function"),
    ],
)
def test_malformed_registrations_are_refused(text, error, monkeypatch):
    monkeypatch.setenv(MODELS.env, text)
    with pytest.raises(ValueError, match=error):
        registry.registered(MODELS)


def test_a_registered_target_that_cannot_load_says_so(monkeypatch):
    monkeypatch.setenv(MODELS.env, "gone=no_such_module_anywhere:build")
    with pytest.raises(ValueError, match=r"model 'gone' \(no_such_module_anywhere:build\) cannot be loaded: No module"):
        registry.resolve(MODELS, "gone")
