"""The bigram kind's export format `bigram-table` (tests only) and its reader."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file, save_file

from draftsmith.heads.files import load_strict
from draftsmith.heads.kind import ExportFormat, register_format

from .model import BigramDrafter


def write_export(drafter, out, base_model, dtype, source) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file({"table": drafter.table.detach().to(dtype).contiguous()}, str(out / "bigram.safetensors"))
    (out / "config.json").write_text(json.dumps({"bigram_vocab": drafter.vocab_size,
                                                 "base_model": base_model}))
    return out


def read_export(folder, config, target_model) -> BigramDrafter:
    drafter = BigramDrafter(config["bigram_vocab"])
    load_strict(drafter,
                {k: v.float() for k, v in load_file(str(Path(folder) / "bigram.safetensors")).items()},
                str(folder))
    return drafter


def register() -> None:
    register_format(ExportFormat("bigram-table", write_export, read_export,
                                 lambda config: "bigram_vocab" in config, "the bigram table (tests only)",
                                 reads_features=False))
