"""The decoding runtime: tree-verification decoder, KV cache, trees, exact acceptance, proposers."""
