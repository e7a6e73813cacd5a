"""Export of trained drafters into the layouts serving engines load (the `export:` section).

End of the training flow: a drafter folder (`save_pretrained`: config.json + model.safetensors +
draftsmith.json, opened by `heads/folder.py`) becomes a folder that the Medusa repo, EAGLE repo,
vLLM, SGLang or HF `generate` loads, with SERVE.md (each engine's command, heads/engines.py) beside it.
The formats themselves live with their kinds (`heads/<kind>/export.py`: an explicit key map from our
state-dict names to theirs, the produced key set checked *exactly*, shapes too, before anything is
written, because the consumers load with `strict=False` or skip unknown names) and are registered in
`heads/kind.py FORMATS`; which kind can be written in which format is the kind's row (`KindSpec.formats`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from draftsmith.heads.engines import serve_commands
from draftsmith.heads.files import SERVING_TREE, export_dtype
from draftsmith.heads.registry import FORMATS


@dataclass
class ExportConfig:
    """`export:` section — which serving layouts to write after training."""

    formats: list[str] = field(default_factory=list)
    dtype: str = "bfloat16"

    def __post_init__(self):
        unknown = [f for f in self.formats if f not in FORMATS]
        if unknown:
            raise ValueError(f"export.formats: unknown {unknown}; valid: {', '.join(FORMATS)}")


def export_drafter(folder, fmt: str, out_folder: str | Path, base_model: str | None = None,
                   dtype: str | torch.dtype = "bfloat16",
                   target_model: torch.nn.Module | None = None) -> Path:
    """Write the drafter of `folder` (a `DrafterFolder`, heads/folder.py) in layout `fmt` to `out_folder`,
    with SERVE.md beside it; layouts that hold target weights take them from `target_model`."""
    if fmt not in FORMATS:
        raise ValueError(f"export format '{fmt}' unknown; valid: {', '.join(FORMATS)}")
    if fmt not in folder.formats:
        raise ValueError(f"export format '{fmt}' is not one of a {folder.kind} drafter's; {folder.path} "
                         f"holds kind '{folder.kind}' (its formats: {', '.join(folder.formats) or 'none'})")
    if FORMATS[fmt].needs_target and target_model is None:
        raise ValueError(f"export format '{fmt}' carries the target's embedding: pass the target "
                         "(target_model)")
    drafter = folder.load(target_model)
    out = Path(FORMATS[fmt].write(drafter, out_folder, base_model or folder.target, export_dtype(dtype),
                                  folder))
    (out / "SERVE.md").write_text(serve_notes(fmt, out, base_model or folder.target, folder))
    # so `eval --drafter EXPORT` serves what the folder served (the engines read SERVE.md's flags)
    if folder.tree is not None:
        (out / SERVING_TREE).write_text(json.dumps({"tree": folder.tree.entry()}) + "\n")
    else:
        (out / SERVING_TREE).unlink(missing_ok=True)  # a re-export into an old folder keeps no stale tree
    return out


def serve_notes(fmt: str, out: Path, base_model: str, folder) -> str:
    """SERVE.md: what was exported, for which target, with which serving tree, and each engine's command."""
    tree, plan = folder.tree, folder.plan
    lines = [f"# Serving {out.name}", "",
             f"- drafter: {folder.kind}, exported as `{fmt}` ({FORMATS[fmt].summary}) from `{folder.path}`",
             f"- target: `{base_model}`, with the chat template the drafter was trained on",
             "- serving tree: "
             f"{tree.label if tree else 'none recorded (a chain of drafter.num_speculative_tokens)'} (the "
             "recipe's choice: the engine flags below use it)"]
    lines += FORMATS[fmt].notes(folder) if FORMATS[fmt].notes else []
    if plan:
        chosen = plan.get("chosen") or {}
        lines.append(f"- `draftsmith plan` measured {chosen.get('label') or 'plain decoding'} fastest on "
                     f"{(plan.get('machine') or {}).get('device')} ({plan.get('dtype')}, batch "
                     f"{plan.get('batch_size')}); that is a choice for that machine and draftsmith's "
                     "decoder, not these engines' flags: re-plan on the serving GPU (or use the engine's own "
                     "tuning) before copying it")
    lines.append("")
    for engine, command in serve_commands(fmt, out.resolve(), base_model, tree):
        lines += [f"## {engine}", "", "```bash", command, "```", ""]
    return "\n".join(lines)
