"""The speculators side of the engine check (runs in the speculators venv, never imports draftsmith).

    python scripts/dev/engine_check_speculators.py OUT

1. `Eagle3DraftModel.from_pretrained(OUT/speculators)` with the loading report: no missing tensor (beyond
   the verifier copies speculators itself never saves) and no unexpected one; the config as speculators
   reads it (aux ids, draft vocabulary, norm_before_residual, speculative tokens, verifier).
2. Its forward on our features (OUT/check.safetensors), step 0, sdpa attention (the default flex attention
   needs block-aligned lengths on a CPU), the lm_head's output captured: max |difference| to our logits.
3. `speculators convert OUT/eagle3 --algorithm eagle3 --verifier TARGET` accepts our eagle3 export, and the
   converted tensors equal the speculators export's.
Writes OUT/speculators-check.json, prints the verdict and exits 1 unless every check holds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import torch
from safetensors.torch import load_file


def check(out: Path) -> None:
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    result = {"speculators": version("speculators"), "transformers": version("transformers"),
              "torch": torch.__version__}
    config = Eagle3SpeculatorConfig.from_pretrained(out / "speculators")
    config.transformer_layer_config._attn_implementation = "sdpa"
    model = Eagle3DraftModel.from_pretrained(out / "speculators", config=config).float().eval()
    # its from_pretrained returns no loading report, so compare the file with the module: every tensor of the
    # file must land in a parameter of the same shape, and every parameter but the verifier copies (which
    # speculators never saves) must come from the file
    saved = load_file(str(out / "speculators" / "model.safetensors"))
    state = model.state_dict()
    never_saved = {"verifier_lm_head.weight", "verifier_norm.weight"}
    result["missing"] = sorted(set(state) - set(saved) - never_saved)
    result["unexpected"] = sorted(set(saved) - set(state))
    result["mismatched"] = sorted(k for k in set(saved) & set(state)
                                  if tuple(saved[k].shape) != tuple(state[k].shape))
    result["loaded_equal"] = all(torch.equal(saved[k].float(), state[k].float())
                                 for k in set(saved) & set(state))
    proposal = model.config.speculators_config.proposal_methods[0]
    result["config"] = {"aux_ids": model.config.eagle_aux_hidden_state_layer_ids,
                        "draft_vocab_size": model.config.draft_vocab_size,
                        "norm_before_residual": model.config.norm_before_residual,
                        "speculative_tokens": proposal.speculative_tokens,
                        "verifier": model.config.speculators_config.verifier.name_or_path}
    check = load_file(str(out / "check.safetensors"))
    captured = {}
    handle = model.lm_head.register_forward_hook(lambda module, args, output: captured.setdefault("logits",
                                                                                                  output))
    with torch.no_grad():
        model(hidden_states=check["hidden_states"].float(), input_ids=check["input_ids"],
              document_ids=torch.zeros_like(check["input_ids"]), position_ids=check["position_ids"],
              ttt_steps=1)
    handle.remove()
    ours = check["logits"].float()
    result["max_abs_logit_diff"] = float((captured["logits"].float() - ours).abs().max())
    result["same_argmax"] = bool(torch.equal(captured["logits"].argmax(-1), ours.argmax(-1)))
    verifier = (out / "verifier.txt").read_text().strip()
    result["config"].update({k: getattr(model.config, k, None)
                             for k in ("norm_before_fc", "fc_norm", "norm_output")})
    if not (out / "eagle3").is_dir():  # a drafter only the speculators layout carries (the EAGLE-3.1 norms)
        result["convert_returncode"] = None
        (out / "speculators-check.json").write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
        return
    run = subprocess.run([str(Path(sys.executable).parent / "speculators"), "convert", str(out / "eagle3"),
                          "--algorithm", "eagle3", "--verifier", verifier, "--output-path",
                          str(out / "converted")],
                         capture_output=True, text=True)
    result["convert_returncode"] = run.returncode
    result["convert_tail"] = (run.stdout + run.stderr)[-1500:]
    if run.returncode == 0:
        converted = load_file(str(out / "converted" / "model.safetensors"))
        exported = load_file(str(out / "speculators" / "model.safetensors"))
        shared = sorted(set(converted) & set(exported))
        result["convert_only_converted"] = sorted(set(converted) - set(exported))
        result["convert_only_exported"] = sorted(set(exported) - set(converted))
        result["convert_tensors_equal"] = all(torch.equal(converted[k].float(), exported[k].float())
                                              for k in shared)
    (out / "speculators-check.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "convert_tail"}, indent=2))


def verdict(out: Path) -> bool:
    """Every check of OUT/speculators-check.json holds: nothing missing, unexpected or mismatched, the loaded
    weights equal, our logits reproduced within 1e-4, and `speculators convert` (where it ran) gives the same
    tensors."""
    r = json.loads((out / "speculators-check.json").read_text())
    converted = r["convert_returncode"] is None or (r["convert_returncode"] == 0
                                                    and r.get("convert_tensors_equal", False))
    ok = (not r["missing"] and not r["unexpected"] and not r["mismatched"] and r["loaded_equal"]
          and r["max_abs_logit_diff"] < 1e-4 and converted)
    print(f"[engine-check] missing {r['missing']} unexpected {r['unexpected']} max |logit diff| "
          f"{r['max_abs_logit_diff']:.3g} convert rc {r['convert_returncode']}: {'OK' if ok else 'FAILED'}")
    return ok


def main() -> None:
    out = Path(sys.argv[1])
    check(out)
    sys.exit(0 if verdict(out) else 1)


if __name__ == "__main__":
    main()
