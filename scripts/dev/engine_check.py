"""Artifacts for the speculators engine check (draftsmith side): an EAGLE-3 drafter exported as `speculators`
and `eagle3`, the target features it is fed and our logits on them, as files the other venv reads.

    python scripts/dev/engine_check.py OUT [--drafter DRAFTER_DIR]

Without --drafter: a tiny random Llama target (written under OUT, the verifier) and a perturbed untrained
EAGLE-3 drafter with a reduced vocabulary. With it: a trained drafter folder and its target.
OUT/check.safetensors holds `hidden_states [1, T, 3H]` (the three aux features concatenated: what the
speculators forward takes), `input_ids [1, T]` (the next tokens, aligned with the features),
`position_ids`, and `logits [1, T, Vd]` (our drafter's step-0 logits on them).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from safetensors.torch import save_file

from draftsmith.distill.loading import ModelConfig, load_target, serving_name
from draftsmith.distill.target import Target
from draftsmith.eval.measure.campaign import load_file
from draftsmith.heads.eagle.ttt import ttt_mask
from draftsmith.heads.export import export_drafter
from draftsmith.heads.files import target_signature
from draftsmith.heads.folder import read_folder
from draftsmith.heads.registry import DrafterConfig, build_drafter


def tiny_target(out: Path) -> Path:
    # test code, not package code
    helpers = load_file(Path(__file__).resolve().parents[2] / "tests" / "helpers.py")
    return helpers.build_tiny_model_dir(out, "llama", layers=6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--drafter", type=Path)
    parser.add_argument("--norms", default="",
                        help="EAGLE-3.1 norms of the tiny drafter, comma-separated: fc_norm or "
                             "norm_before_fc, and norm_output (speculators layout only: the eagle3 layout "
                             "refuses them)")
    args = parser.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    if args.drafter:
        folder = read_folder(args.drafter)
        target = load_target(ModelConfig(target=folder.target, device="cpu"))
    else:
        target_dir = tiny_target(out)
        target = load_target(str(target_dir), dtype="float32", device="cpu")
        torch.manual_seed(0)
        norms = {name: True for name in args.norms.split(",") if name}
        drafter = build_drafter(DrafterConfig.for_kind("eagle3", draft_vocab=100, ttt_steps=2,
                                                       aux_layers=[1, 3, 4], **norms),
                                target.model,
                                torch.arange(target.vocab_size).flip(0))
        with torch.no_grad():
            for p in drafter.parameters():
                if p.requires_grad:
                    p.add_(0.05 * torch.randn_like(p))
        drafter.serving_tree = {"topk": 1, "depth": 3, "budget": 3}
        folder = read_folder(drafter.save_pretrained(out / "drafter", target=str(target_dir),
                                                     tokenizer=target.tokenizer, signature=target_signature(
                                                         target.model, target.tokenizer)))
    base = serving_name(ModelConfig(target=folder.target))
    for fmt in ("speculators",
                ) if any(folder.config.get(k) for k in ("norm_before_fc", "fc_norm", "norm_output")) \
            else ("speculators", "eagle3"):
        export_drafter(folder, fmt, out / fmt, base_model=base, dtype="float32", target_model=target.model)
    drafter = folder.load(target.model).eval()
    ids = torch.tensor([target.chat_ids("Speculative decoding drafts tokens that the target then verifies.")])
    feats = Target(target.model, target.tokenizer).forward(ids, layers=list(drafter.feature_layers)).hidden
    # [1, T, 3H]: features at t
    hidden = torch.cat([feats[k] for k in drafter.feature_layers], dim=-1)[:, :-1]
    next_ids = ids[:, 1:]  # token t+1 goes with the feature at t
    T = next_ids.shape[1]
    with torch.no_grad():
        fused = drafter.fuse({k: v[:, :-1] for k, v in feats.items()})
        logits = drafter.logits(drafter.step(fused, next_ids, torch.arange(T)[None], ttt_mask(T, 0, "cpu"),
                                             drafter.new_cache()))
    save_file({"hidden_states": hidden.contiguous(), "input_ids": next_ids.contiguous(),
               "position_ids": torch.arange(T)[None].contiguous(), "logits": logits.contiguous()},
              str(out / "check.safetensors"))
    (out / "verifier.txt").write_text(base + "\n")
    print(f"[engine-check] wrote {out}: speculators/, eagle3/, check.safetensors (T={T}, verifier {base})")


if __name__ == "__main__":
    main()
