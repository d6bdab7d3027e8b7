"""Every registered model folder has the same skeleton, and says in its ``__init__`` which file holds what."""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
from pathlib import Path

import pytest

import mstar_graphs
from mstar.worker.registry import MODELS

SKELETON = ("graph.py", "components.py", "config.py", "checkpoints.py", "tiny.py", "frontend.py")

SHARED = {"common"}  # graphs/common: the shelf the models share, not a model


def _registered() -> dict[str, str]:
    """name -> module of the ``mstar.models`` entry points that are graphs of this package."""
    return {
        ep.name: ep.value.partition(":")[0]
        for ep in importlib.metadata.entry_points(group=MODELS.group)
        if ep.value.startswith(f"{mstar_graphs.__name__}.")
    }


def _folder(module: str) -> Path:
    package = importlib.import_module(module.rpartition(".")[0])
    return Path(package.__file__).parent


REGISTERED = _registered()


def test_models_are_registered():
    assert REGISTERED, f"no {MODELS.group} entry point names a {mstar_graphs.__name__} graph"


@pytest.mark.parametrize("name", sorted(REGISTERED))
def test_registered_factory_is_the_components_module(name):
    module = REGISTERED[name]
    assert module.endswith(".components"), f"{name}: its entry point names {module}, not the folder's components.py"


@pytest.mark.parametrize("name", sorted(REGISTERED))
def test_folder_has_the_skeleton(name):
    folder = _folder(REGISTERED[name])
    missing = [file for file in SKELETON if not (folder / file).is_file()]
    assert not missing, f"{folder.name}: no {', '.join(missing)}"


@pytest.mark.parametrize("name", sorted(REGISTERED))
def test_init_docstring_says_which_file_holds_what(name):
    package = importlib.import_module(REGISTERED[name].rpartition(".")[0])
    doc = package.__doc__ or ""
    missing = [file for file in SKELETON if f"``{file}``" not in doc]
    assert not missing, f"{package.__name__}.__doc__ does not name {missing}"


def test_every_model_folder_is_registered():
    folders = {info.name for info in pkgutil.iter_modules(mstar_graphs.__path__) if info.ispkg} - SHARED
    registered = {_folder(module).name for module in REGISTERED.values()}
    assert folders <= registered, f"model folders without a {MODELS.group} entry point: {sorted(folders - registered)}"
