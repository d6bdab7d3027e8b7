"""V-JEPA 2-AC: a ViT video encoder and an action-conditioned predictor whose rollouts are
frame Loops over a persistent KV, and CEM planning over them.

Every model folder has the same skeleton:

- ``graph.py``: the Walk Graph (walks encode, observe, extend, rollout, plan);
- ``components.py``: what a Worker builds (``vjepa2_components``, the ``mstar.models`` entry point);
- ``config.py``: ``VJepa2Config`` and its presets;
- ``checkpoints.py``: Meta's AC checkpoint, transformers' encoder, or the cached generated one;
- ``tiny.py``: the generated checkpoint, in Meta's layout;
- ``frontend.py``: the user-facing API, one request builder per walk.

The rest: ``encoder.py`` / ``predictor.py`` / ``vit.py`` / ``rope.py`` (the networks), ``planner.py``
(the CEM nodes), ``pose.py`` (poses and the actions between them), ``reference.py`` (Meta's native
rollout and planner).
"""
