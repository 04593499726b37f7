"""Cloud adapters behind one small contract (see providers.base)."""
