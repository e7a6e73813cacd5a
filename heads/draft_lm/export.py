"""The draft LM's export formats: `hf`, a plain HF causal LM folder (AutoModelForCausalLM; vLLM's
`draft_model` method, HF assisted generation), and `gguf` / `gguf-q8_0` (heads/llamacpp.py), that folder
through llama.cpp's converter as a GGUF llama.cpp serves with `--spec-type draft-simple` (f16, f32 when
exported in float32 as the engine eval does, or q8_0). `hf` is registered in heads/kind.py FORMATS as the
generic format: any HF model folder that no other format recognises (an EAGLE layer's Llama config or vLLM's
MedusaModel are recognised first).
"""

from __future__ import annotations

from draftsmith.heads.draft_lm.model import DraftLM
from draftsmith.heads.engines import SGLANG, VLLM
from draftsmith.heads.kind import ExportFormat, register_format
from draftsmith.heads.llamacpp import GgufKind, register_gguf


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
register_gguf("draft-lm", GgufKind(write_hf, "draft-simple"))  # its tokenizer travels in the hf folder
