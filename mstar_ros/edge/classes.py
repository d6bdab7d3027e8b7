"""Each front-end's request class on the edge box: pi0.5 chunks are control, voice interactive, images batch.

The class is given to the front-end's Conductor as an override for every node of its graph
(``Conductor(priorities={node: class})``, mstar.priority), so whatever requests the front-end builds
(a policy node's, a WebRTC peer's, an image route's), its node calls carry that class, and the device
thread that steps every Conductor of the process serves control first. Where the runtime has no priority
classes yet (no ``priorities`` argument), the Conductor is built without them and the class is reported
as unavailable.
"""

from __future__ import annotations

import inspect

CLASSES = ("control", "interactive", "batch")
DEFAULT_CLASS = {"pi05": "control", "voice": "interactive", "images": "batch"}


def classes_available() -> bool:
    """The runtime takes per-node classes (mstar.priority and ``Conductor(priorities=...)``)."""
    from mstar.conductor import Conductor

    return "priorities" in inspect.signature(Conductor).parameters


def class_overrides(graph, cls: str) -> dict:
    """``Conductor`` keyword arguments giving every node of ``graph`` the class ``cls`` (none where the
    runtime has no classes)."""
    if not classes_available():
        return {}
    return {"priorities": {node.name: cls for node in graph.nodes}}


def classed_conductor(graph, modules, config, cls: str, class_limits: dict[str, int] | None = None):
    """An embedded Conductor for ``graph`` whose every node call is of class ``cls``, with the in-flight
    ``class_limits`` (class name -> requests at once)."""
    from mstar.conductor import Conductor

    limits = {"class_limits": class_limits} if class_limits else {}
    return Conductor(graph, modules, config=config, **class_overrides(graph, cls), **limits)
