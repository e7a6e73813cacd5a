"""Draft-LM drafter (DistillSpec-style): a small causal LM on the target's tokenizer, distilled on its
distributions.

In the flow: `registry.build_drafter` builds the student from the target's HF model, `train/` calls
`compute_loss(batch)` with the target's logits from the online source or offline shards (and, with
`train.onpolicy_ratio > 0`, on answers the student sampled itself, `train/onpolicy.py`),
`save_pretrained` writes a plain HF model folder (+ `draftsmith.json`) that `eval/serving.py`
drafts with as it is, and `heads/export.py --format hf` casts for serving and HF assisted generation.

Two students (settings in `drafter.draft_lm`, `DraftLMConfig`):
- layer subset (default): a fresh model of the target's own class whose config keeps k of its N
  layers (`layers`, or `num_layers` picked first/strided; per-layer config lists such as
  `layer_types` follow), with copies of the embedding, those layers, the final norm and the
  lm_head. Untrained, it is the target run through only those layers.
- `config`: a fresh randomly initialised model from that config.json (target's vocabulary).
`lora_rank > 0` trains LoRA adapters (peft) on the linear layers instead of all weights; they are
merged on save.

Shapes: input_ids / loss_mask / attention_mask `[B, T]`; student and target logits `[B, T, V]`
(or target top-k `[B, T, k]`); the loss is taken at the N positions whose next token is an
assistant token: `[N, V]` -> `[N]` -> mean.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from draftsmith.heads.files import write_meta
from draftsmith.heads.losses import TOKEN_LOSSES, token_loss
from draftsmith.heads.runtime.acceptance import chain_tau
from draftsmith.heads.runtime.tree import chain_entry
from draftsmith.heads.settings import KindSettings


@dataclass
class DraftLMConfig(KindSettings):
    """`drafter.draft_lm`: which student (a subset of the target's layers, or a fresh model) and LoRA."""

    layers: list[int] = field(default_factory=list)  # target layers kept (explicit ids); [] = pick num_layers
    num_layers: int | Literal["auto"] = 4  # auto: a fifth of the target's layers (at least 1)
    layer_pick: Literal["first", "strided"] = "strided"
    config: str | None = None  # a config.json of the target's family on its tokenizer: a fresh small model
    lora_rank: int = 0  # > 0: train LoRA adapters (peft) on the copied layers instead of all weights
    lora_alpha: float = 16.0

    def __post_init__(self):
        if (self.num_layers != "auto" and self.num_layers < 1) or self.lora_rank < 0:
            raise ValueError("drafter.draft_lm.num_layers must be >= 1 and drafter.draft_lm.lora_rank >= 0")


def pick_layers(num_layers: int, explicit: list[int], count: int | str, how: str) -> list[int]:
    """Target layer ids the student keeps: `explicit` as given, else the first or evenly strided `count`
    (`auto`: a fifth of the target's, at least 1; strided always keeps the first and the last layer: the last
    one feeds the final norm)."""
    if explicit:
        bad = [i for i in explicit if not 0 <= i < num_layers]
        if bad or list(explicit) != sorted(set(explicit)):
            raise ValueError(f"drafter.draft_lm.layers {list(explicit)}: need distinct increasing ids in "
                             f"[0, {num_layers - 1}] (the target has {num_layers} layers)")
        return list(explicit)
    if count == "auto":
        count = max(1, round(num_layers / 5))
    if not 1 <= count <= num_layers:
        raise ValueError(f"drafter.draft_lm.num_layers {count} must be in [1, {num_layers}] (the target's "
                         "layers)")
    if how == "first" or count == 1:
        return list(range(count))
    if how != "strided":
        raise ValueError(f"drafter.draft_lm.layer_pick '{how}' unknown; valid: first, strided")
    return [round(i * (num_layers - 1) / (count - 1)) for i in range(count)]


def _layers_prefix(model: nn.Module) -> tuple[str, int]:
    """State-dict prefix of the decoder blocks (e.g. "model.layers.") and their count."""
    layers = model.get_decoder().layers
    for name, module in model.named_modules():
        if module is layers:
            return f"{name}.", len(layers)
    raise TypeError(f"{type(model).__name__}: decoder layers not found among its modules")


def layer_subset_config(config, keep: list[int]):
    """A copy of the target's config with `num_hidden_layers = len(keep)` and every per-layer list
    (a list with one entry per layer whose name mentions layers, e.g. `layer_types`) subset to `keep`."""
    n = config.num_hidden_layers
    config = copy.deepcopy(config)
    for key, value in config.to_dict().items():
        if "layer" in key and isinstance(value, (list, tuple)) and len(value) == n:
            setattr(config, key, [value[i] for i in keep])
    config.num_hidden_layers = len(keep)
    config.dtype = torch.float32  # the student trains in fp32 (autocast does the rest), whatever the target's
    return config


def build_layer_subset(target_model: nn.Module, keep: list[int]) -> nn.Module:
    """Fresh model of the target's class with copies (never shared tensors) of the kept layers,
    the embedding, the final norm and the lm_head."""
    prefix, _ = _layers_prefix(target_model)
    student = type(target_model)(layer_subset_config(target_model.config, keep))
    source = target_model.state_dict()
    state = {}
    for key in student.state_dict():
        src = key
        if key.startswith(prefix):
            j, rest = key[len(prefix):].split(".", 1)
            src = f"{prefix}{keep[int(j)]}.{rest}"
        state[key] = source[src].detach().float().cpu()
    student.load_state_dict(state, strict=True)  # copies into the student's own tensors
    return student


def build_from_config(path: str, target_model: nn.Module) -> nn.Module:
    """Fresh random model from `drafter.draft_lm.config` (a config.json or a folder holding one)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    vocab = target_model.get_output_embeddings().weight.shape[0]
    if getattr(config, "vocab_size", None) != vocab:
        raise ValueError(f"drafter.draft_lm.config {path}: vocab_size {getattr(config, 'vocab_size', None)} "
                         f"differs from the target's {vocab}; set \"vocab_size\": {vocab} in that "
                         "config.json (a drafter must use the target's tokenizer)")
    config.dtype = torch.float32
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


class DraftLM(nn.Module):
    """An HF causal LM (`self.model`, maybe peft-wrapped) with the distillation loss around it."""

    kind = "draft-lm"
    feature_layers = ()  # reads no target features: only the target's logits

    def __init__(self, model: nn.Module, loss: str = "kl", jsd_beta: float = 0.5, temperature: float = 1.0,
                 num_speculative_tokens: int = 5, source_layers: list[int] | None = None):
        super().__init__()
        if loss not in TOKEN_LOSSES:
            raise ValueError(f"drafter.loss '{loss}' unknown for draft-lm; valid: {', '.join(TOKEN_LOSSES)}")
        self.model = model
        self.loss, self.jsd_beta, self.temperature = loss, jsd_beta, temperature
        self.num_speculative_tokens = num_speculative_tokens
        self.source_layers = list(source_layers) if source_layers is not None else None

    @classmethod
    def build(cls, cfg, target_model: nn.Module, token_counts=None) -> DraftLM:
        """The student of `cfg` (a DrafterConfig) for the target's HF model; see the module doc."""
        own = cfg.settings
        if own.config:
            model, keep = build_from_config(own.config, target_model), None
        else:
            _, n = _layers_prefix(target_model)
            keep = pick_layers(n, own.layers, own.num_layers, own.layer_pick)
            model = build_layer_subset(target_model, keep)
        model.generation_config = copy.deepcopy(target_model.generation_config)  # eos / pad ids of the target
        if own.lora_rank > 0:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(r=own.lora_rank, lora_alpha=own.lora_alpha,
                                                     target_modules="all-linear", lora_dropout=0.0,
                                                     bias="none"))
        return cls(model, cfg.loss, cfg.jsd_beta, cfg.distill_temperature, cfg.num_speculative_tokens, keep)

    def forward(self, input_ids: torch.Tensor, **kwargs):
        return self.model(input_ids=input_ids, **kwargs)

    def compute_loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        """The configured loss at positions whose next token is an assistant token; acc_top1 = the student's
        argmax equals the target's (greedy acceptance), expected_tau = the chain estimate Σ acc^d."""
        ids, attn = batch["input_ids"], batch["attention_mask"]  # [B, T]
        logits = self.model(input_ids=ids, attention_mask=attn).logits  # [B, T, V]
        # position t predicts token t+1: count it when t+1 is a real assistant token
        mask = batch["loss_mask"][:, 1:].bool() & attn[:, 1:].bool() & attn[:, :-1].bool()  # [B, T-1]
        student = logits[:, :-1][mask]  # [N, V]
        labels = ids[:, 1:][mask]  # [N]
        dense, top_v = batch.get("target_logits"), batch.get("target_topk_values")
        teacher = indices = None
        if dense is not None:
            teacher = dense[:, :-1][mask]  # [N, V]
            best = teacher.argmax(-1)
        elif top_v is not None:
            teacher, indices = top_v[:, :-1][mask], batch["target_topk_indices"][:, :-1][mask]  # [N, k]
            best = indices.gather(-1, teacher.argmax(-1, keepdim=True))[:, 0]
        else:
            best = labels  # hard labels only: the data's next token stands in for the target's choice
        if labels.numel():
            per_pos = token_loss(self.loss, student, teacher, indices, labels, self.jsd_beta,
                                 self.temperature)
            loss = per_pos.mean()
            acc = (student.argmax(-1) == best).float().mean().item()
        else:  # no counted position in this batch: a 0 that keeps the graph
            loss, acc = logits.sum() * 0.0, 0.0
        return loss, {"loss": loss.item(), "acc_top1": acc,
                      "expected_tau": chain_tau([acc], self.num_speculative_tokens)}

    def merged_model(self) -> nn.Module:
        """The plain HF model to save: LoRA adapters merged into a copy (training can go on)."""
        if hasattr(self.model, "merge_and_unload"):
            return copy.deepcopy(self.model).merge_and_unload()
        return self.model

    def save_pretrained(self, folder: str | Path, target: str, tokenizer=None,
                        signature: dict | None = None) -> Path:
        """A plain HF folder (config, safetensors, generation config, tokenizer) + `draftsmith.json`."""
        folder = Path(folder)
        self.merged_model().save_pretrained(folder, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
        write_meta(folder, self.kind, target, self.feature_layers, signature, loss=self.loss,
                   jsd_beta=self.jsd_beta, temperature=self.temperature,
                   num_speculative_tokens=self.num_speculative_tokens, source_layers=self.source_layers,
                   tree=chain_entry(self.num_speculative_tokens))
        return folder

    @classmethod
    def from_pretrained(cls, folder: str | Path, target_model: nn.Module | None = None,
                        meta: dict | None = None
                        ) -> DraftLM:
        """Reload a `save_pretrained` folder (fp32; LoRA, if any, is already merged; needs no target weights);
        `meta` is its draftsmith.json as `heads/folder.py` read it (the loss settings live there)."""
        from transformers import AutoModelForCausalLM

        folder, meta = Path(folder), meta or {}
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        return cls(model, meta.get("loss", "kl"), meta.get("jsd_beta", 0.5), meta.get("temperature", 1.0),
                   meta.get("num_speculative_tokens", 5), meta.get("source_layers"))

    def export_hf(self, out_folder: str | Path, dtype: torch.dtype,
                  tokenizer_from: str | Path | None = None) -> Path:
        """`--format hf`: the model cast to `dtype` with its generation config and (if found) tokenizer —
        what `AutoModelForCausalLM.from_pretrained`, HF `generate(assistant_model=...)` and
        `draftsmith eval --drafter` load."""
        out = Path(out_folder)
        model = copy.deepcopy(self.merged_model()).to(dtype)
        model.config.dtype = dtype
        model.save_pretrained(out, safe_serialization=True)
        if tokenizer_from is not None and (Path(tokenizer_from) / "tokenizer_config.json").is_file():
            from transformers import AutoTokenizer

            AutoTokenizer.from_pretrained(tokenizer_from).save_pretrained(out)
        return out
