"""V-JEPA 2-AC: a ViT video encoder and an action-conditioned predictor whose rollouts are
frame Loops over a persistent KV (see ``graph.py``)."""
