"""Model layers the engine and the models share: tensor-parallel shards, prepacked CPU
linears, logits over a restricted vocabulary. Below the engine: of the runtime it imports
only the tensor-parallel group (mstar.parallel)."""
