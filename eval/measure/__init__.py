"""Measurement around the decoder: the eval stage, the batched bench, the serving plan, engine evals, plots,
reports."""
