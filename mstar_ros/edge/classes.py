"""Request classes on the edge box: each front-end's requests carry their own, the edge config may override.

The front-ends choose per request (mstar.priority, docs/scheduling.md): pi0.5's chunks are control
(``Pi05Policy.request``, the policy node's ``priority`` parameter), voice turns, TTS and chat are
interactive (``Request``'s default), BAGEL's generation and edits are batch and its understanding and
chat interactive (``mstar_graphs.bagel.requests``). So by default a front-end's Conductor overrides
nothing: one BAGEL Conductor serves both a batch image and an interactive question, each in its class.
A front-end's ``priority:`` in the edge config, when set, is the class of every request its Conductor
takes: ``submit`` writes it into ``request.priority`` (so the front-end's ``class_limits`` count its
requests in that class) and every node call carries it (``Conductor(priorities={node: class})``).
"""

from __future__ import annotations

CLASSES = ("control", "interactive", "batch")
# what each front-end's requests carry when the edge config sets no class (shown in the host's banner)
DEFAULT_CLASS = {"pi05": "control", "voice": "interactive", "images": "batch"}


def class_overrides(graph, cls: str) -> dict[str, str]:
    """Node name -> ``cls`` for every node of ``graph`` ("" : none, each request keeps its own class)."""
    return {node.name: cls for node in graph.nodes} if cls else {}


def classed_conductor(graph, modules, config, cls: str = "", class_limits: dict[str, int] | None = None):
    """An embedded Conductor for ``graph``: every request (and so every node call) of class ``cls`` when
    given (else each request's own), with the in-flight ``class_limits`` (class name -> requests at once)."""
    from mstar.conductor import Conductor

    class FrontConductor(Conductor):
        """A Conductor whose requests all take the front-end's class, limits included."""

        def submit(self, request):
            if cls:  # the class_limits count request.priority: the front-end's class must be there
                request.priority = cls
            return super().submit(request)

    return FrontConductor(
        graph, modules, config=config, priorities=class_overrides(graph, cls), class_limits=class_limits or None
    )
