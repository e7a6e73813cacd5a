"""The DFlash proposer (eval floor): a chain of K tokens from ONE drafter forward.

In the flow: the decoder hands the proposer the target's features of every verified position (`begin` /
`commit`); each batch of new features becomes context keys and values in every draft layer (computed once,
kept like vLLM's draft KV cache). At `propose` the block [root, mask x K] at positions p..p+K attends to all
of them and to itself; mask slot i gives the logits of draft token i. Greedy: the argmax per slot. Sampling:
token i is drawn from slot i's warped distribution, which does not depend on the tokens drawn before it (no
token is fed back), so row i of `probs` is exactly the law token i was drawn from given its ancestors (the
contract of heads/runtime/proposer.py) and verification stays exact.

Shapes: context keys/values `[1, nkv, S, hd]` per layer; block `[1, K+1]`; mask `[1, 1, K+1, S+K+1]`; logits
`[K, Vd]` over the draft vocabulary, scattered to `[K, V]` (-inf outside it); probs `[K, V]`.
"""

from __future__ import annotations

import torch

from draftsmith.heads.runtime.proposer import (
    Draft,
    Proposer,
    block_draft,
    chain_length,
    target_vocabulary,
    trained_drafter,
)


class DFlashProposer(Proposer):
    """Drafts a chain of `length` tokens with a DFlash drafter (heads/dflash/model.py) in one forward."""

    def __init__(self, drafter: torch.nn.Module, length: int, confidence_threshold: float = 0.0):
        self.drafter = drafter.eval().requires_grad_(False)
        self.name, self.length, self.threshold = drafter.kind, length, confidence_threshold
        self.feature_layers = tuple(drafter.feature_layers)
        self.tree = f"chain-{length}" + (f"-conf{confidence_threshold:g}" if confidence_threshold else "")

    @property
    def device(self) -> torch.device:
        return self.drafter.fc.weight.device

    def begin(self, prompt_ids, features) -> None:
        self.context: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # per layer (keys, values)
        self.verified = 0
        self._add(features)

    def commit(self, new_tokens, features) -> None:
        self._add(features)

    @torch.no_grad()
    def _add(self, features) -> None:
        """Context keys/values of the newly verified positions, appended to every layer's."""
        fused = self.drafter.fuse({k: v[None].to(self.device) for k, v in features.items()})  # [1, n, H]
        n = fused.shape[1]
        positions = torch.arange(self.verified, self.verified + n, device=self.device)[None]
        new = self.drafter.context_kv(fused, positions)
        self.context = new if self.context is None else \
            [(torch.cat([k0, k1], 2), torch.cat([v0, v1], 2)) for (k0, v0), (k1, v1) in zip(self.context,
                                                                                            new)]
        self.verified += n

    def block_outputs(self, context: list[int]) -> torch.Tensor:
        """The block [root, mask x K] at the root's position over every verified position: the mask slots'
        outputs `[K, H]` (the root's row is unused)."""
        p = len(context) - 1  # the root's position: every position before it is verified context
        if self.verified != p:
            raise RuntimeError(f"{self.name} proposer out of sync: {self.verified} verified positions, "
                               f"context {len(context)}")
        d, K = self.drafter, self.length
        ids = torch.tensor([[context[-1]] + [d.mask_token_id] * K], device=self.device)  # [1, K+1]
        positions = torch.arange(p, p + K + 1, device=self.device)[None]
        # all context, whole block
        mask = torch.ones(1, 1, K + 1, p + K + 1, dtype=torch.bool, device=self.device)
        return d.block(ids, positions, self.context, mask)[0, 1:]

    @torch.no_grad()
    def propose(self, context, sampling, generator) -> Draft:
        logits = target_vocabulary(self.drafter.logits(self.block_outputs(context)).float(), self.drafter)
        return block_draft(logits, sampling, generator, self.threshold)  # [K, V] rows


def build(cfg, target, folder=None) -> DFlashProposer:
    """A chain as long as the serving tree is deep (what vLLM's num_speculative_tokens takes of a tree)."""
    drafter = trained_drafter(folder, target)
    return DFlashProposer(drafter, chain_length(cfg, folder), cfg.confidence_threshold)
