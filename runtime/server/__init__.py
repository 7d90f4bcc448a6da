"""`ft serve`: the Ollama, OpenAI and Anthropic HTTP APIs over one backend (see protocol.py)."""
