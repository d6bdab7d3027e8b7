"""What a process may build: models and Worker plugins registered on its own side, by name.

A Setup message names a model (and plugins); the Worker looks the name up here and never
imports anything a peer names. Names come from two places, both chosen by whoever installs
or starts the process, never by a message:

- installed packages, as Python entry points: a graph package declares, in its setup.py,
  ``entry_points={"mstar.models": ["pi05 = mstar_graphs.pi05.components:pi05_components"]}``
  (plugins under ``mstar.worker_plugins``);
- the environment of the process, for a graph developed locally and for tests:
  ``MSTAR_MODELS="toy=my_pkg.graph:toy_components,other=..."`` (plugins:
  ``MSTAR_WORKER_PLUGINS``), or the Worker's ``--model NAME=module:function`` flag. A
  Conductor's launched Workers inherit its environment.

A name registered twice with different targets is an error, not a silent override.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_TARGET = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


@dataclass(frozen=True)
class Kind:
    group: str  # entry-point group
    env: str  # environment variable of extra registrations
    what: str  # for messages


MODELS = Kind("mstar.models", "MSTAR_MODELS", "model")
PLUGINS = Kind("mstar.worker_plugins", "MSTAR_WORKER_PLUGINS", "Worker plugin")

_flags: dict[str, dict[str, str]] = {}  # group -> name -> target, from register() (command-line flags)


class NotRegistered(ValueError):
    """The name is not registered in this process: nothing was imported for it."""


def _check_entry(kind: Kind, name: str, target: str, source: str) -> None:
    if not _NAME.fullmatch(name):
        raise ValueError(f"{source}: {kind.what} name {name!r} must be letters, digits, '_', '.' or '-'")
    if not _TARGET.fullmatch(target):
        raise ValueError(f"{source}: {kind.what} {name!r} must name a module:function, got {target!r}")


def parse_registrations(kind: Kind, text: str, source: str) -> dict[str, str]:
    """``"a=pkg.mod:fn,b=pkg.other:fn"`` -> ``{"a": "pkg.mod:fn", "b": ...}``."""
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, target = (s.strip() for s in item.partition("="))
        if not sep:
            raise ValueError(f"{source}: expected NAME=module:function, got {item!r}")
        _check_entry(kind, name, target, source)
        out[name] = target
    return out


def register(kind: Kind, name: str, target: str) -> None:
    """Registers ``name`` in this process only (the Worker's --model / --plugin flags)."""
    _check_entry(kind, name, target, "register")
    _flags.setdefault(kind.group, {})[name] = target


def _local(kind: Kind) -> dict[str, tuple[str, str]]:
    """name -> (target, where it was registered), from the environment and the flags."""
    found = {n: (t, kind.env) for n, t in parse_registrations(kind, os.environ.get(kind.env, ""), kind.env).items()}
    for name, target in _flags.get(kind.group, {}).items():
        if name in found and found[name][0] != target:
            raise ValueError(
                f"{kind.what} {name!r} is registered as {found[name][0]} by {kind.env} and as "
                f"{target} on the command line"
            )
        found[name] = (target, "the command line")
    return found


def _installed(kind: Kind) -> dict[str, list[importlib.metadata.EntryPoint]]:
    found: dict[str, list[importlib.metadata.EntryPoint]] = {}
    for ep in importlib.metadata.entry_points(group=kind.group):
        if not any(other.value == ep.value for other in found.get(ep.name, [])):
            found.setdefault(ep.name, []).append(ep)
    return found


def registered(kind: Kind) -> dict[str, str]:
    """Every name this process can resolve -> its target (nothing is imported)."""
    names = {name: eps[0].value for name, eps in _installed(kind).items()}
    names.update({name: target for name, (target, _) in _local(kind).items()})
    return dict(sorted(names.items()))


def resolve(kind: Kind, name: str) -> Callable:
    """The factory registered as ``name``; raises NotRegistered (having imported nothing) when none is."""
    installed, local = _installed(kind), _local(kind)
    if name not in installed and name not in local:
        names = sorted({*installed, *local})
        hint = " (a module:function is never imported from a message)" if ":" in name else ""
        raise NotRegistered(
            f"{kind.what} {name!r} is not registered in this process{hint}; registered: {', '.join(names) or 'none'}. "
            f"An installed package registers one under the entry-point group {kind.group!r}; for a local one, "
            f"set {kind.env}=NAME=module:function where this process is started"
        )
    targets = {ep.value for ep in installed.get(name, [])} | ({local[name][0]} if name in local else set())
    if len(targets) > 1:
        raise ValueError(f"{kind.what} {name!r} is registered with different targets: {', '.join(sorted(targets))}")
    target = targets.pop()
    module_name, _, attr = target.partition(":")
    try:
        obj = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"{kind.what} {name!r} ({target}) cannot be loaded: {exc}") from None
    if not callable(obj):
        raise ValueError(f"{kind.what} {name!r} ({target}) is not callable")
    return obj
