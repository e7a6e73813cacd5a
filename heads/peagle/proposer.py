"""The P-EAGLE proposer (eval floor): a chain of K tokens from ONE drafter forward.

In the flow: the decoder hands the proposer the target's features of every verified position (`begin` /
`commit`). At `propose` ONE forward of the drafter's layer runs, causal:

    the verified positions not yet in the drafter's KV cache, with their real features (EAGLE-3's catch-up);
        the last of them reads the root token and is slot 0 of the draft
    K-1 mask queries (mask token, fc(mask_hidden)) at the positions after it (vLLM 0.32.0 with
        parallel_drafting: the bonus slot, then `parallel_drafting_token_id` slots; heads/peagle/model.py)

Slot 0 gives draft token 1, mask slot i token i+1. Afterwards the cache keeps the verified keys but slot 0's:
the mask slots' belong to this draft only, and slot 0 is run again as the first query of the next forward (so
asking twice for a draft gives the same one).

Greedy: the argmax per slot (draft vocabulary -> target ids). Sampling: token i is drawn from slot i's warped
distribution over the target vocabulary (draft-vocabulary ids only; the others -inf, as vLLM's compute_logits
does), which does not depend on the tokens drawn before it (nothing is fed back), so row i of `probs` is
exactly the law token i was drawn from given its ancestors (heads/runtime/proposer.py's contract): exact
verification.

Shapes: features `[k, H]` per key; one query block `[1, k + K-1]`; mask `[1, 1, k + K-1, cached + k + K-1]`;
probs `[K, V]`.
"""

from __future__ import annotations

import torch

from draftsmith.heads.runtime import kv_cache
from draftsmith.heads.runtime.proposer import (
    Draft,
    Proposer,
    block_draft,
    chain_length,
    target_vocabulary,
    trained_drafter,
)


class PEagleProposer(Proposer):
    """Drafts a chain of `length` tokens with a P-EAGLE drafter (heads/peagle/model.py) in one forward."""

    def __init__(self, drafter: torch.nn.Module, length: int, confidence_threshold: float = 0.0):
        if length < 1:
            raise ValueError(f"peagle proposer: a chain of {length} tokens; set "
                             "drafter.num_speculative_tokens >= 1")
        self.drafter = drafter.eval().requires_grad_(False)
        self.name, self.length, self.threshold = drafter.kind, length, confidence_threshold
        self.feature_layers = tuple(drafter.feature_layers)
        self.tree = f"chain-{length}" + (f"-conf{confidence_threshold:g}" if confidence_threshold else "")
        self.calls = 0  # drafter forwards so far (one per propose)

    @property
    def device(self) -> torch.device:
        return self.drafter.fc.weight.device

    def begin(self, prompt_ids, features) -> None:
        self.cache = self.drafter.new_cache()
        self.verified = 0  # positions whose keys (real features) the drafter's cache holds
        # [k, H]
        self.pending = self.drafter.fuse({k: v[None].to(self.device) for k, v in features.items()})[0]

    def commit(self, new_tokens, features) -> None:
        new = self.drafter.fuse({k: v[None].to(self.device) for k, v in features.items()})[0]  # [k, H]
        # after the root's, kept by propose
        self.pending = torch.cat([self.pending, new.to(self.pending.dtype)])

    def _forward(self, context: list[int]) -> torch.Tensor:
        """The one drafter forward: the pending verified positions + K-1 mask queries -> logits `[K, Vd]`."""
        d, K = self.drafter, self.length
        k, start = self.pending.shape[0], self.verified
        if start + k != len(context) - 1:
            raise RuntimeError(f"peagle proposer out of sync: {start} + {k} verified positions, context "
                               f"{len(context)}")
        if k == 0:
            raise ValueError("peagle proposer: a prompt of one token has no verified position to draft from; "
                             "prefill at least two tokens (a chat template always does)")
        dtype = d.fc.weight.dtype
        # [k + K-1, H]
        hidden = torch.cat([self.pending.to(dtype), d.mask_state().to(dtype).expand(K - 1, -1)])
        ids = torch.tensor([context[start + 1:] + [d.mask_token_id] * (K - 1)], device=self.device)
        q = k + K - 1
        positions = torch.arange(start, start + q, device=self.device)[None]
        mask = torch.ones(1, 1, q, start + q, dtype=torch.bool, device=self.device)
        # causal, like vLLM
        mask[0, 0, :, start:] = torch.ones(q, q, dtype=torch.bool, device=self.device).tril()
        out = d.step(hidden[None], ids, positions, mask, self.cache)[0]  # [q, H]
        self.calls += 1
        # keep the verified keys but the root position's: it is run again with the next forward (whose slot 0
        # it is), so a draft can be asked for twice; the mask slots' keys are this draft's only
        self.verified, self.pending = start + k - 1, self.pending[-1:]
        kv_cache.crop_cache(self.cache, self.verified)
        return d.logits(out[k - 1:]).float()  # [K, Vd]: the root's query, then the mask slots

    @torch.no_grad()
    def propose(self, context, sampling, generator) -> Draft:
        logits = target_vocabulary(self._forward(context), self.drafter)  # [K, V]
        return block_draft(logits, sampling, generator, self.threshold)


def build(cfg, target, folder=None) -> PEagleProposer:
    """A chain as long as the serving tree is deep (what vLLM's num_speculative_tokens takes of a tree)."""
    drafter = trained_drafter(folder, target)
    return PEagleProposer(drafter, chain_length(cfg, folder), cfg.confidence_threshold)
