"""The optimiser a run trains with (`train.optimizer`): AdamW, or Muon on the hidden weight matrices with
AdamW on the rest (speculators' default for its drafters).

Muon (torch.optim.Muon, torch >= 2.9: momentum orthogonalised by Newton-Schulz iterations) only takes 2-D
matrices, and its authors keep embeddings, output heads, norms and biases on AdamW. Here a matrix goes to Muon
when it is a trainable 2-D weight of an `nn.Linear` whose both sides exceed 1 and that is not an output head
(a module whose output width is a vocabulary: the target's or the draft one); embeddings (`nn.Embedding`:
DSpark's Markov W1), heads, norms, biases and vectors stay on AdamW. Muon's step is scaled to match AdamW's
update RMS (`adjust_lr_fn="match_rms_adamw"`), so one `train.lr` and one schedule serve both; `train.muon_lr`
gives the Muon group its own rate (speculators' trainer, hsc-v0.7.0 src/speculators/train/config/schema.py:
`muon_lr` defaults to 10 x lr with the same RMS matching), the schedule scaling each group's own rate; AdamW
alone reads no `muon_lr` (a recipe that sets it stays valid under `train.optimizer=adamw`). One
`train.weight_decay` serves both groups (speculators gives Muon 0.1 and AdamW 0.01 of their own).

`MuonWithAdamW` is one `torch.optim.Optimizer` over both, sharing their param-group dicts: an LR schedule
(LambdaLR) sets each group's lr once and both inner optimisers see it; `state_dict` holds both, so a
checkpoint resumes the same run. DeepSpeed's ZeRO and FSDP shard or flatten parameters, which Muon cannot
orthogonalise: refused there with one sentence.
"""

from __future__ import annotations

import torch
from torch import nn


def muon_matrices(module: nn.Module, vocab_sizes: set[int]) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(the matrices Muon trains, every other trainable parameter) of `module` (module doc)."""
    muon, seen = [], set()
    for sub in module.modules():
        if isinstance(sub, nn.Linear) and sub.weight.requires_grad and min(sub.weight.shape) > 1 \
                and sub.out_features not in vocab_sizes:
            muon.append(sub.weight)
            seen.add(id(sub.weight))
    rest = [p for p in module.parameters() if p.requires_grad and id(p) not in seen]
    return muon, rest


class MuonWithAdamW(torch.optim.Optimizer):
    """Muon on `matrices`, AdamW on `rest`, stepped together (module doc)."""

    def __init__(self, matrices: list[nn.Parameter], rest: list[nn.Parameter], lr: float,
                 weight_decay: float, muon_lr: float | None = None):
        self.muon = torch.optim.Muon(matrices, lr=lr if muon_lr is None else muon_lr,
                                     weight_decay=weight_decay, adjust_lr_fn="match_rms_adamw") \
            if matrices else None
        self.adamw = torch.optim.AdamW(rest, lr=lr, weight_decay=weight_decay) if rest else None
        inner = [o for o in (self.muon, self.adamw) if o is not None]
        super().__init__([g for o in inner for g in o.param_groups], {"lr": lr})
        # the same group dicts as the inner optimisers (a schedule's lr reaches them)
        self.param_groups = [g for o in inner for g in o.param_groups]

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for o in (self.muon, self.adamw):
            if o is not None:
                o.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in (self.muon, self.adamw):
            if o is not None:
                o.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"muon": self.muon.state_dict() if self.muon else None,
                "adamw": self.adamw.state_dict() if self.adamw else None}

    def load_state_dict(self, state: dict) -> None:
        for key, o in (("muon", self.muon), ("adamw", self.adamw)):
            if o is not None:
                o.load_state_dict(state[key])
        self.param_groups = [g for o in (self.muon, self.adamw) if o is not None for g in o.param_groups]


def make_optimizer(module: nn.Module, t_cfg, vocab_sizes: set[int], sharded: bool = False):
    """The run's optimiser over `module`'s trainable parameters (`train.optimizer`, `train.lr`,
    `train.weight_decay`)."""
    params = [p for p in module.parameters() if p.requires_grad]
    muon_lr = getattr(t_cfg, "muon_lr", None)
    if muon_lr is not None and muon_lr <= 0:
        raise ValueError(f"train.muon_lr={muon_lr}: a learning rate is > 0 (null: train.lr)")
    if t_cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=t_cfg.lr, weight_decay=t_cfg.weight_decay)
    if sharded:
        raise ValueError("train.optimizer=muon orthogonalises whole weight matrices, which ZeRO / FSDP shard "
                         "or flatten: train with DDP (one process or several) or set train.optimizer=adamw")
    matrices, rest = muon_matrices(module, vocab_sizes)
    return MuonWithAdamW(matrices, rest, t_cfg.lr, t_cfg.weight_decay, muon_lr)
