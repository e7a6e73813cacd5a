"""Inference: the tree-verification decoder, proposers, acceptance rules and benchmarks."""
