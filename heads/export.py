"""Export of trained drafters into the layouts serving engines load (the `export:` section).

End of the training flow: a drafter checkpoint becomes a folder that the Medusa repo, EAGLE repo,
vLLM, SGLang or HF `generate(assistant_model=...)` loads. The key maps and writers arrive with the
trainable drafter kinds; this module holds the section they share.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FORMATS = ("hf", "medusa", "medusa-vllm", "eagle", "eagle3")


@dataclass
class ExportConfig:
    """`export:` section — which serving layouts to write after training."""

    formats: list[str] = field(default_factory=list)
    dtype: str = "bfloat16"

    def __post_init__(self):
        unknown = [f for f in self.formats if f not in FORMATS]
        if unknown:
            raise ValueError(f"export.formats: unknown {unknown}; valid: {', '.join(FORMATS)}")
