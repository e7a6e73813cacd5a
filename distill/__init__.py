"""Target model, data and self-distillation: turns prompts and the target into training signal."""
