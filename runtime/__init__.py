"""The ft runtime: model families, expert memory, execution (built in later issues)."""
