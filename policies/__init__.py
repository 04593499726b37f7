"""Policy schema, loader and ranking engine (pure; no I/O beyond reading YAML)."""
