"""The race against llama.cpp (benchmarks/vs_llamacpp.py): a synthetic GGUF both engines read,
llama-bench's side, ft's side at the same VRAM, and the report both feed."""
