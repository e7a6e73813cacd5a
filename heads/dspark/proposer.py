"""The DSpark proposer (eval floor): DFlash's one block forward, then the slots drafted left to right with the
Markov bias of the token drafted before each, stopping at the confidence head's threshold.

In the flow: context keys and values are DFlash's (heads/dflash/proposer.py `begin` / `commit`). At `propose`
the block [root, mask x K] gives every slot's output in one forward; slot i's logits are its base logits plus
W2 W1[x_{i-1}] (x_0 the root, x_{i-1} the token drafted at slot i-1). Greedy: the argmax per slot. Sampling:
token i is drawn from slot i's warped law GIVEN the tokens drawn before it, and that row is q row i -- the
chain contract of heads/runtime/proposer.py (a token's law given its ancestors), so verification stays exact.
With a confidence head and `threshold` > 0 the chain ends before the first slot whose confidence (computed
from its output and x_{i-1}, before its token is drawn) is below the threshold, as llama.cpp b11434 does for
draft-dspark (common/speculative.cpp, `--spec-draft-p-min`); without the head, DFlash's rule (stop after a
token whose own probability is below it).

Shapes: block outputs `[K, H]`; base logits `[K, Vd]`; a slot's row `[V]` (-inf outside a reduced vocabulary);
probs `[n, V]`.
"""

from __future__ import annotations

import torch

from draftsmith.heads.dflash.proposer import DFlashProposer
from draftsmith.heads.runtime.proposer import (
    Draft,
    chain_length,
    chain_parents,
    target_vocabulary,
    trained_drafter,
)
from draftsmith.heads.runtime.verify import logits_to_probs


class DSparkProposer(DFlashProposer):
    """Drafts a chain of up to `length` tokens with a DSpark drafter (heads/dspark/model.py)."""

    @torch.no_grad()
    def propose(self, context, sampling, generator) -> Draft:
        d, K = self.drafter, self.length
        out = self.block_outputs(context)  # [K, H]: the mask slots
        normed = d.norm(out)  # [K, H]: what the lm_head and the confidence head read
        base = d.target_lm_head(normed).float()  # [K, Vd]
        use_conf = bool(self.threshold) and d.confidence_head is not None
        tokens, probs, prev = [], [], context[-1]
        for i in range(K):
            bias, embed = d.markov_head(torch.tensor([prev], device=self.device))
            if use_conf and float(torch.sigmoid(d.confidence_head(normed[i:i + 1], embed))) < self.threshold:
                break
            row = target_vocabulary(base[i:i + 1] + bias.float(), d)[0]  # [V]
            if sampling.argmax_drafts:
                tok = int(row.argmax())
            else:
                probs.append(logits_to_probs(row, sampling))
                tok = int(torch.multinomial(probs[-1], 1, generator=generator))
            tokens.append(tok)
            prev = tok
            if self.threshold and not use_conf and float(row.softmax(-1)[tok]) < self.threshold:
                break
        return Draft(tokens=tokens, parents=chain_parents(len(tokens)),
                     probs=None if sampling.argmax_drafts or not probs else torch.stack(probs))


def build(cfg, target, folder=None) -> DSparkProposer:
    drafter = trained_drafter(folder, target)
    return DSparkProposer(drafter, chain_length(cfg, folder), cfg.confidence_threshold)
