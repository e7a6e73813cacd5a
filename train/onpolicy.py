"""On-policy distillation data (DistillSpec): the student answers some prompts itself before the target scores
them.

In the flow it wraps the online source (`train/sources.py`): batch from the loader -> this source
rewrites the answers of a fraction `train.onpolicy_ratio` of the sequences with the student's own
sampled continuation of their prompt -> the live target scores the new batch -> the drafter's loss.
The student then learns the target's distribution on the sequences it will actually draft.

Per row: prompt = the tokens before the first `loss_mask = 1`; the student (unwrapped, eval mode,
no grad) samples up to `train.onpolicy_max_new_tokens` at `train.onpolicy_temperature` (0 = greedy),
an eos token ends the answer (kept, as the data keeps it); the new row is prompt + answer with
`loss_mask = 1` on the answer. Rows are rewritten with a generator seeded from `train.seed` and the
batch's row ids, so a resumed run draws exactly what the uninterrupted one drew. Validation (the loop
puts the module in eval mode) keeps the data's answers, so its numbers stay comparable across steps.

Shapes: batch `[B, T]` -> batch `[B, T']` (T' = longest row after rewriting); sampling runs the
selected rows together, left-padded, with the student's KV cache: `[b, P]` prefill, then `[b, 1]`.
"""

from __future__ import annotations

import hashlib
import json
import math

import torch
from transformers import DynamicCache

from draftsmith.distill.collate import collate
from draftsmith.distill.target import left_pad
from draftsmith.heads.registry import KINDS
from draftsmith.train.runtime import TrainingError


def batch_generator(seed: int, batch: dict, stream: str) -> torch.Generator:
    """CPU generator for one batch: seeded by the run seed, the batch's row ids and the stream name."""
    rows = batch["index"].tolist() if "index" in batch else batch["input_ids"].tolist()
    digest = hashlib.sha256(json.dumps([seed, stream, rows]).encode()).digest()  # stable across processes
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") % 2**63)


@torch.no_grad()
def sample_continuations(model, prompts: list[list[int]], max_new_tokens: int, temperature: float,
                         eos: set[int], pad_id: int, generator: torch.Generator) -> list[list[int]]:
    """Sample each prompt's continuation from `model` (an HF causal LM); returns the new tokens per prompt,
    an eos included when it ended the answer. Tokens are drawn on the CPU from `generator`, so the draw
    does not depend on the device the model runs on."""
    device = next(model.parameters()).device
    B = len(prompts)
    ids, attn = left_pad(prompts, pad_id, device)  # every row's next token sits at the same column
    pos = (attn.cumsum(-1) - 1).clamp_min(0)  # [B, P]: positions count real tokens only
    cache = DynamicCache(config=model.config)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, cache=cache,
                   use_cache=True).logits[:, -1]
    out, done = [[] for _ in prompts], [False] * B
    for _ in range(max_new_tokens):
        logits = logits.float().cpu()  # [B, V]
        if temperature > 0:
            # [B]
            tokens = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=generator)[:, 0]
        else:
            tokens = logits.argmax(-1)
        for i, t in enumerate(tokens.tolist()):
            if not done[i]:
                out[i].append(t)
                done[i] = t in eos
        if all(done):
            break
        # [B, 1]
        step = torch.tensor([[t if not d else pad_id] for t, d in zip(tokens.tolist(), done)], device=device)
        attn = torch.cat([attn, torch.ones_like(step)], -1)  # finished rows run on; their output is ignored
        pos = pos[:, -1:] + 1  # [B, 1]
        logits = model(input_ids=step, attention_mask=attn, position_ids=pos, cache=cache,
                       use_cache=True).logits[:, -1]
    return out


class OnPolicySource:
    """Wraps the online source: rewrites the answers of a fraction of each training batch, then scores it."""

    def __init__(self, inner, student: torch.nn.Module, ratio: float, max_new_tokens: int, temperature: float,
                 eos: set[int], pad_id: int, seed: int):
        self.inner, self.student = inner, student
        self.ratio, self.max_new_tokens, self.temperature = ratio, max_new_tokens, temperature
        self.eos, self.pad_id, self.seed = set(eos), pad_id, seed

    def rewrite(self, batch: dict) -> dict:
        """The batch with ⌊r·B⌋ rows' answers (one more with probability frac(r·B)) replaced by the student's
        samples; `onpolicy_rows [B]` marks them."""
        B = batch["input_ids"].shape[0]
        pick = batch_generator(self.seed, batch, "pick")
        exact = self.ratio * B  # floor(r·B) rows, plus one more with probability frac(r·B)
        n = math.floor(exact) + int(torch.rand((), generator=pick).item() < exact - math.floor(exact))
        chosen = sorted(torch.randperm(B, generator=pick)[:n].tolist())
        rows = []
        for i in range(B):
            length = int(batch["attention_mask"][i].sum())
            ids, mask = batch["input_ids"][i, :length].tolist(), batch["loss_mask"][i, :length].tolist()
            rows.append({"input_ids": ids, "loss_mask": mask})
        starts = {i: rows[i]["loss_mask"].index(1) for i in chosen if 1 in rows[i]["loss_mask"]}
        prompts = {i: rows[i]["input_ids"][:start] for i, start in starts.items() if start > 0}
        if not prompts:
            return dict(batch,
                        onpolicy_rows=torch.zeros(B, dtype=torch.bool, device=batch["input_ids"].device))
        self.student.eval()
        try:
            answers = sample_continuations(self.student.model, list(prompts.values()), self.max_new_tokens,
                                           self.temperature, self.eos, self.pad_id,
                                           batch_generator(self.seed, batch, "sample"))
        finally:
            self.student.train()
        for i, answer in zip(prompts, answers):
            rows[i] = {"input_ids": prompts[i] + answer,
                       "loss_mask": [0] * len(prompts[i]) + [1] * len(answer)}
        device = batch["input_ids"].device
        out = {k: v.to(device) for k, v in collate(rows).items()}
        out["onpolicy_rows"] = torch.tensor([i in prompts for i in range(B)], device=device)  # [B]
        return dict(batch, **out)

    def __call__(self, batch: dict) -> dict:
        if self.student.training:
            batch = self.rewrite(batch)
        return self.inner(batch)


def build_onpolicy_source(train_cfg, source, drafter: torch.nn.Module, target, spec):
    """`source` wrapped for on-policy data when `train.onpolicy_ratio > 0`, else `source` itself.

    `drafter` is the module being trained (the loop's module wraps this same object, so its weights are
    the live ones; its kind's row `spec` must say it `samples_itself`, i.e. it is an HF causal LM in
    `.model`); `target` the distill Target (its eos and pad ids end and pad the samples).
    """
    if train_cfg.onpolicy_ratio <= 0:
        return source
    if not spec.samples_itself:
        able = [name for name, s in KINDS.items() if s.samples_itself]
        raise TrainingError(f"train.onpolicy_ratio > 0 samples answers from the drafter itself, which only "
                            f"drafter.kind {' / '.join(able)} can do (this run: {spec.name}); set "
                            "train.onpolicy_ratio: 0")
    return OnPolicySource(source, drafter, train_cfg.onpolicy_ratio, train_cfg.onpolicy_max_new_tokens,
                          train_cfg.onpolicy_temperature, set(target.eos_token_ids), target.pad_token_id,
                          train_cfg.seed)
