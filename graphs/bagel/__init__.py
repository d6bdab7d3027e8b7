"""BAGEL-7B-MoT (ByteDance-Seed): a Qwen2 Mixture-of-Transformers LLM that reads text and images
(SigLIP NaViT rows) and generates images by rectified flow over FLUX VAE latent tokens.

Language side:

- ``config.py``: ``BagelConfig`` (``LlmConfig`` from ``llm_config.json`` with app.py's overrides,
  ``BagelDims``: the sizes no released json holds);
- ``tokenizer.py``: ``BagelTokenizer`` (Qwen2.5's tokenizer.json, the four specials, text turns);
- ``mot_layer.py`` / ``llm.py``: the MoT decoder layer and ``BagelLLM`` (the AR module);
- ``checkpoints.py``: the released directory layout, the loader's name map, the cached tiny checkpoint
  (``tiny.py`` writes it);
- ``guidance.py``: the flow schedule and classifier-free guidance combination;
- ``reference.py``: a naive dense reference of the LLM and the generation recipe, for parity tests.
"""
