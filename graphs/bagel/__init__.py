"""BAGEL-7B-MoT (ByteDance-Seed): a Qwen2 Mixture-of-Transformers LLM that reads text and images
(SigLIP NaViT rows) and generates images by rectified flow over FLUX VAE latent tokens.

The model as served:

- ``graph.py``: the Walk Graph (encoders, the three LLM views, the guided flow Loop, the VAE decoder,
  the preview decoder fed by the flow's progress reports) and ``next_walk``; ``nodes.py``: its stateless nodes; ``flow_llm.py``: the ``bagel`` AR module (the
  LLM plus its flow contract: schedule, latent rows, guidance);
- ``components.py``: what a Worker loads for the nodes it hosts (the ``mstar.models`` entry point);
- ``frontend.py``: ``BagelModel``, what the gateway, the CLI and ROS serve (answers and images);
  ``requests.py``: its Requests, built as the reference's inferencer builds its three contexts;
  ``context_layout.py``: one context as the engine takes it; ``interleaved_contexts.py``: the three contexts of
  interleaved texts and images (several input images); ``image_pack.py``: several images as request inputs; ``generation_params.py``: a generation's
  settings as the tensor the graph carries; ``image_options.py``: the images API's / CLI's BAGEL options
  (guidance, think) judged; ``think_requests.py`` / ``think_prompts.py``: think mode (its two requests,
  the thought's text; the reference's system prompts, verbatim);
- ``config.py``: ``BagelConfig`` (``LlmConfig`` from ``llm_config.json`` with app.py's overrides,
  ``BagelDims``: the sizes no released json holds); ``vit_config.py``: the ViT's;
- ``checkpoints.py``: the released directory layout, the loader's name map, the cached tiny checkpoint
  (``tiny.py`` writes it, with ``tiny_vision.py``);
- ``tokenizer.py``: Qwen2.5's tokenizer.json, the four specials, text turns.

Components: ``mot_layer.py`` / ``llm.py`` (the MoT decoder layer, ``BagelLLM``), ``siglip_navit.py`` /
``vision_encoder.py`` (SigLIP NaViT, connector, position table), ``autoencoder.py`` (FLUX VAE),
``latent_embed.py`` / ``latent_tokens.py`` / ``sincos.py`` / ``patch_grid.py`` (latent tokens and their
embedding), ``image_transform.py`` (the reference's resize rules), ``guidance.py`` (schedule and CFG),
``ema_parts.py`` (loading one part of ``ema.safetensors``); ``reference.py``: a naive dense reference of
the LLM and the recipes, for parity tests.
"""
