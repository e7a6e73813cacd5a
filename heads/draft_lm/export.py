"""The draft LM's export format `hf`: a plain HF causal LM folder (AutoModelForCausalLM; vLLM's `draft_model`
method, HF assisted generation). Registered in heads/kind.py FORMATS as the generic format: any HF model
folder that no other format recognises (an EAGLE layer's Llama config or vLLM's MedusaModel are recognised
first).
"""

from __future__ import annotations

from draftsmith.heads.draft_lm.model import DraftLM
from draftsmith.heads.engines import SGLANG, VLLM
from draftsmith.heads.kind import ExportFormat, register_format


def write_hf(drafter: DraftLM, out, base_model, dtype, folder):
    return drafter.export_hf(out, dtype, tokenizer_from=folder.path)


register_format(ExportFormat(
    "hf", write_hf, lambda folder, config, target_model: DraftLM.from_pretrained(folder),
    lambda config: "model_type" in config and "speculators_model_type" not in config,
    "a plain HF causal LM folder (AutoModelForCausalLM, HF assisted generation)", reads_features=False,
    generic=True, vllm_method="draft_model", serve=lambda s: [
        (f"{VLLM} (a draft model)", s.vllm()), (SGLANG, s.sglang("STANDALONE")),
        ("HF transformers", f"model.generate(**inputs, assistant_model=AutoModelForCausalLM.from_pretrained("
                            f"'{s.drafter}'))")]))
