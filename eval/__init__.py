"""Inference: `decode/` the decoding runtime (decoder, proposers, trees, acceptance), `measure/` what measures
it (eval, bench, plan, engines)."""
