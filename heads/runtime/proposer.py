"""The proposer interface: what the tree-verification decoder asks a drafter for, each step.

In the flow: `eval/decode/decoder.py` asks a proposer for a `Draft` each step, verifies it with one target
forward, and tells the proposer what was accepted. A proposer sees the token context (prompt +
everything emitted, the last token being the root that the target has not processed yet) and,
if it asks for them through `feature_layers`, the target's hidden states at the processed
positions (EAGLE-style drafters; features lag the context by the root token).

A `Draft` is a tree: n tokens with parents (-1 = root, else an earlier node), and optionally the
distributions `probs [n, V]` the tokens were drawn from (None = chosen deterministically, e.g.
top-k; exact sampling then treats each as a point mass).

The contract exact sampling rests on (heads/runtime/verify.py `verify_sampling`): row i of `probs` is the law
node i's token WAS drawn from, given its ancestors, and siblings are independent draws. A proposer may decide
where a draft ends, or whether to draft a node at all, from what it has drawn so far, but never keep a drawn
token only if it passes a test (dropping it and stopping, or redrawing): the kept tokens would then follow
q conditioned on passing, not q (the old confidence stop did this; tests/unit/test_sampling.py keeps it
as a negative twin). Each kind's proposer lives in its own module here and is named by its row in
`heads/registry.py`; `eval/serving.py` builds it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draftsmith.heads.runtime.tree import chain_parents, serving_tree
from draftsmith.heads.runtime.verify import SamplingConfig, logits_to_probs


@dataclass
class Draft:
    tokens: list[int]
    parents: list[int]
    probs: torch.Tensor | None = None  # [n, V]: distribution each token was drawn from

    @property
    def n(self) -> int:
        return len(self.tokens)


EMPTY_DRAFT = Draft(tokens=[], parents=[])


class Proposer:
    """Base interface; the default proposes nothing (plain autoregressive decoding)."""

    name = "none"
    tree = "none"  # label of the draft shape, reported in eval summaries
    feature_layers: tuple[int | str, ...] = ()

    def begin(self, prompt_ids: list[int], features: dict[int, torch.Tensor]) -> None:
        """A new sequence: the prompt was prefilled; features are `{layer: [T, H]}` of its tokens."""

    def propose(self, context: list[int], sampling: SamplingConfig,
                generator: torch.Generator | None) -> Draft:
        return EMPTY_DRAFT

    def commit(self, new_tokens: list[int], features: dict[int, torch.Tensor]) -> None:
        """`new_tokens` (accepted drafts + bonus) were appended to the context; features are those
        of the positions the target verified and kept (root + accepted nodes): `{layer: [k, H]}`."""


def on_target(drafter: torch.nn.Module, target) -> torch.nn.Module:
    """A loaded drafter moved to the target's device and cast to its dtype, parameter by parameter:
    buffers such as RoPE's inv_freq stay fp32 (rounded to bf16 it would shift every position's angle)."""
    drafter = drafter.to(device=target.device)
    for param in drafter.parameters():
        param.data = param.data.to(target.dtype)
    return drafter


def trained_drafter(folder, target) -> torch.nn.Module:
    """The module of a drafter folder or export, refused before loading when it was made for another target
    (the folder reader compares vocabulary, hidden size and tokenizer), then put on the target's device."""
    if folder is None:
        raise ValueError("a trained drafter needs drafter.path (a drafter folder or one of its exports)")
    folder.check_target(target.vocab_size, target.config.hidden_size, target.tokenizer, target.name,
                        model=target.model)
    return on_target(folder.load(target.model), target)


def target_vocabulary(logits: torch.Tensor, drafter: torch.nn.Module) -> torch.Tensor:
    """Logits `[K, Vd]` over a drafter's reduced draft vocabulary (`drafter.reduced`, `draft_to_target`) as
    logits `[K, V]` over the target's, ids outside it -inf (what vLLM's compute_logits does with d2t); others
    unchanged."""
    if not getattr(drafter, "reduced", False):
        return logits
    full = logits.new_full((logits.shape[0], drafter.vocab_size), float("-inf"))
    full[:, drafter.draft_to_target(torch.arange(drafter.draft_vocab_size, device=logits.device))] = logits
    return full


def block_draft(logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator | None,
                threshold: float = 0.0) -> Draft:
    """A chain drafted in one forward (DFlash, P-EAGLE): slot i's token from its own row of `logits [K, V]`,
    argmax at T=0, else drawn from the row's law, which is reported as q row i. With `threshold` the chain
    ends after the first token whose probability is below it (kept: decided from what was drawn, so still
    exact)."""
    tokens, probs = [], []
    for row in logits:
        if sampling.argmax_drafts:
            tok = int(row.argmax())
        else:
            probs.append(logits_to_probs(row, sampling))  # [V]
            tok = int(torch.multinomial(probs[-1], 1, generator=generator))
        tokens.append(tok)
        if threshold and float(row.softmax(-1)[tok]) < threshold:
            break
    return Draft(tokens=tokens, parents=chain_parents(len(tokens)),
                 probs=None if sampling.argmax_drafts else torch.stack(probs))


def chain_length(cfg, folder) -> int:
    """How many tokens a chain drafter drafts: the serving tree's depth (what vLLM's num_speculative_tokens
    takes of a tree), else drafter.num_speculative_tokens."""
    tree = serving_tree(cfg, folder.tree, default=f"chain-{cfg.num_speculative_tokens}")
    return tree.depth if tree.dynamic else max(len(path) for path in tree.paths)
