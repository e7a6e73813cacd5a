"""Medusa-2: Medusa heads trained jointly with LoRA adapters on the target (through peft).

Sits in train/ because it owns both sides: the target (distill) and the heads (heads). One step:

    LoRA target forward (with grad) -> final hidden [B, T, H] -> heads loss (soft labels: the
    ORIGINAL target's distribution, read with the adapters disabled)
    + keep_kl * KL(original target || LoRA target) on assistant positions   # the target stays itself

The heads are then served with the LoRA-merged target (`drafter/target/`, a plain HF folder):
they were trained on its hidden states. Verification stays exact either way — it is the merged
target whose output is reproduced, which the KL term keeps close to the original's.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from draftsmith.heads.files import update_meta


class JointMedusa(torch.nn.Module):
    """Heads + a peft-wrapped target; `forward(batch)` is the joint loss (DDP syncs through it)."""

    def __init__(self, target, heads: torch.nn.Module, drafter_cfg):
        """`drafter_cfg` is the run's DrafterConfig: its `medusa` section names the LoRA (rank, alpha,
        modules) and the weight of the term that keeps the target itself (`keep_kl`)."""
        from peft import LoraConfig, get_peft_model

        super().__init__()
        own = drafter_cfg.settings
        config = LoraConfig(r=own.lora_rank, lora_alpha=own.lora_alpha, target_modules=list(own.lora_modules),
                            lora_dropout=0.0, bias="none")
        target.model = get_peft_model(target.model, config)  # hooks on the decoder layers keep working
        self.target, self.peft, self.drafter, self.keep_kl = target, target.model, heads, own.keep_kl

    def forward(self, batch: dict):
        ids, attn = batch["input_ids"], batch["attention_mask"]
        out = self.target.forward(ids, attention_mask=attn, layers=["final"])  # LoRA on, with grad
        with torch.no_grad(), self.peft.disable_adapter():
            reference = self.peft(input_ids=ids, attention_mask=attn).logits.float()  # [B, T, V]
        loss, metrics = self.drafter.compute_loss(dict(batch, features={"final": out.hidden["final"].float()},
                                                       target_logits=reference))
        # [B, T-1]: position predicts an assistant token
        mask = (batch["loss_mask"][:, 1:].bool() & attn[:, :-1].bool())
        ref = F.log_softmax(reference[:, :-1][mask], dim=-1)  # [N, V]
        own = F.log_softmax(out.logits[:, :-1][mask].float(), dim=-1)  # [N, V]
        keep = (ref.exp() * (ref - own)).sum(-1).mean() if ref.numel() else out.logits.sum() * 0.0
        metrics.update(keep_kl=keep.item(), heads_loss=metrics["loss"])
        total = loss + self.keep_kl * keep
        metrics["loss"] = total.item()
        return total, metrics

    def save(self, folder: Path, target_name: str, tokenizer=None, signature=None) -> Path:
        """Heads (draftsmith layout), the LoRA adapter, and the merged target the heads serve with."""
        folder = Path(folder)
        self.drafter.save_pretrained(folder, target=target_name, signature=signature)
        self.peft.save_pretrained(folder / "lora")
        merged = self.peft.merge_and_unload()
        merged.save_pretrained(folder / "target", safe_serialization=True)
        if self.target.tokenizer is not None:
            self.target.tokenizer.save_pretrained(folder / "target")
        update_meta(folder, medusa2=True, serve_target="target", base_target=target_name)
        return folder
