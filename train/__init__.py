"""The run: CLI, config, pipeline and the training loop (imports everything below it)."""
