"""pi0.5 (openpi): SigLIP image encoder node, Gemma prefix LM + adaRMS action expert AR module.

Every model folder has the same skeleton:

- ``graph.py``: the Walk Graph (SigLIP -> prefix -> flow Loop of the expert);
- ``components.py``: what a Worker builds (``pi05_components``, the ``mstar.models`` entry point);
- ``config.py``: ``Pi05Config``, from openpi's or LeRobot's config.json;
- ``checkpoints.py``: name maps and the cached generated checkpoint (``checkpoint_layout.py``,
  ``shape_check.py``: what a directory holds, before any weight is read);
- ``tiny.py``: the generated checkpoint, in LeRobot's layout;
- ``frontend.py``: the user-facing API, ``Pi05Policy`` (load, observation -> request, actions).

The rest: ``siglip.py`` (Pi05ImageEncoder), ``gemma.py`` / ``expert.py`` / ``pi05.py`` (Pi05Model, on
graphs/common's layers), ``prompt.py`` / ``tokenizer.py`` (the prefix), ``norm_stats.py`` /
``normalization.py`` / ``image_resize.py`` (observation handling), ``direct.py`` (one call, no
runtime: the benchmark baseline), ``reference.py`` (dense recompute-every-step sampling).
"""
