"""Blocks shared by the model families: norms, rotary embeddings, attention, MLPs, routers."""
