"""Acceptance rules: which draft-tree path the target keeps, and the token it adds after it.

Where it sits: after the decoder's verification forward (root + n nodes, see ``tree.py`` for the
tree-index convention) and before ``kv_cache.compact_cache`` keeps the accepted path.

- ``verify_greedy``: target argmax at each node; lossless w.r.t. greedy decoding.
- ``verify_sampling``: multi-draft recursive rejection sampling; the emitted tokens are distributed
  exactly as if sampled from the target one by one.

Shapes: draft ``tokens [n]``, ``target_logits`` / ``target_probs [n+1, V]`` (row j = target's
next-token distribution after tree index j), ``draft_probs [n, V]`` (row i = distribution node i's
token was drawn from). ``logits_to_probs`` maps ``[..., V]`` logits to probabilities for BOTH the
target and the drafter, so the two sides of the acceptance ratio use the same warping.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draftsmith.heads.runtime.tree import TreeBuffers

# A rejection residual max(p - q, 0) with less mass than this is float noise from p ~= q; such a
# rejection happens with probability <= this mass, so keeping p instead costs at most that much.
_RESIDUAL_EPS = 1e-6


@dataclass
class SamplingConfig:
    """Decoding distribution: temperature 0 means greedy; top_k 0 and top_p 1.0 are off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    # at T > 0, how a drafter that could sample picks its tokens: "sampled" draws each from its own warped
    # law q (reported as q: the most a chain can be accepted); "greedy" takes q's argmax and reports no q
    # (one-hot), the rule vLLM (by default) and llama.cpp serve (heads/engines.py RULES "llamacpp-sampling")
    draft: str = "sampled"

    def __post_init__(self) -> None:
        if self.draft not in ("sampled", "greedy"):
            raise ValueError(f"draft must be 'sampled' or 'greedy', got {self.draft!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def argmax_drafts(self) -> bool:
        """Drafters take their argmax (greedy decoding, or the greedy draft rule at T > 0)."""
        return self.greedy or self.draft == "greedy"


def logits_to_probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Temperature, then top-k, then top-p (nucleus), renormalised; float32 ``[..., V]``.

    Greedy gives the one-hot of the argmax. Top-k keeps ties with the k-th logit. Top-p keeps the
    smallest prefix of the sorted distribution whose mass reaches top_p (always the top token).
    """
    logits = logits.float()
    if cfg.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()  # [..., V]
    logits = logits / cfg.temperature
    if 0 < cfg.top_k < logits.shape[-1]:
        kth = logits.topk(cfg.top_k, dim=-1).values[..., -1:]  # [..., 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(-1)  # [..., V]
    if cfg.top_p < 1:
        sorted_probs, order = probs.sort(-1, descending=True)  # [..., V]
        mass_before = sorted_probs.cumsum(-1) - sorted_probs  # [..., V]
        drop_sorted = mass_before >= cfg.top_p  # [..., V] the prefix already reached top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # [..., V] back to vocab order
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


@dataclass
class Verdict:
    """Outcome of one verification step."""

    accepted: list[int]  # tree indices (1..n) of the accepted nodes, root-to-node order
    tokens: list[int]  # accepted node tokens, then the bonus: the target's own token after the last one


def _as_list(tokens: list[int] | torch.Tensor) -> list[int]:
    return tokens.tolist() if isinstance(tokens, torch.Tensor) else list(tokens)


def verify_greedy(
    tokens: list[int] | torch.Tensor, buffers: TreeBuffers, target_logits: torch.Tensor
) -> Verdict:
    """Longest root path whose every token is the target's argmax at its parent.

    Exact for greedy decoding: each accepted token is what the target would have emitted next, and
    the bonus is the target's argmax after the last one. Among siblings carrying the same matching
    token, the one with the longest accepted continuation wins (first in node order on ties).
    """
    tokens = _as_list(tokens)
    top = target_logits.argmax(-1).tolist()  # [n+1]
    best_len = [0] * (buffers.n + 1)
    best_child = [-1] * (buffers.n + 1)
    # Nodes are topologically ordered, so a reverse sweep sees every child before its parent.
    for j in range(buffers.n, -1, -1):
        for c in buffers.children[j]:
            if tokens[c - 1] == top[j] and best_len[c] + 1 > best_len[j]:
                best_len[j], best_child[j] = best_len[c] + 1, c
    accepted = []
    j = 0
    while best_child[j] >= 0:
        j = best_child[j]
        accepted.append(j)
    return Verdict(accepted, [tokens[c - 1] for c in accepted] + [top[j]])


def rejection_residual(p: torch.Tensor, q: torch.Tensor | None, x: int) -> torch.Tensor:
    """The target's law for the next sibling after child token `x` (drawn from `q`) was rejected:
    norm(max(p - q, 0)); for a deterministic proposal (q = one-hot of x) that is p without x, renormalised.
    A residual with no mass (p ~= q up to float noise) keeps p (see _RESIDUAL_EPS)."""
    if q is None:
        residual = p.clone()
        residual[x] = 0.0
    else:
        residual = (p - q).clamp_min(0.0)  # [V]
    mass = float(residual.sum())
    return residual / mass if mass > _RESIDUAL_EPS else p


def verify_sampling(
    tokens: list[int] | torch.Tensor,
    buffers: TreeBuffers,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    residual=rejection_residual,
) -> Verdict:
    """Multi-draft recursive rejection sampling over the tree (SpecInfer-style).

    At node u with target distribution p, children are tried in order: child c (token x drawn from
    q_c) is accepted with probability min(1, p[x] / q_c[x]); on rejection p becomes
    norm(max(p - q_c, 0)) and the next sibling is tried; if none is accepted the bonus is drawn
    from the current p. Why exact: one try + fallback to the residual outputs y with probability
    min(p, q)(y) + (1 - sum min(p, q)) * residual(y) = p(y), so by induction over the siblings the
    token emitted after u is distributed as the target's p_u, and descending into the accepted
    child conditions on that token exactly as autoregressive sampling would. This needs each
    sibling's token to be a fresh draw from its q_c, independent of the earlier siblings (i.i.d.
    drafts, with replacement), or a deterministic proposal: ``draft_probs=None`` means q = one-hot of
    the token, e.g. top-k trees. What the decoder drafts at T > 0: sampled chains (draft LM) with their
    q, deterministic trees otherwise. Siblings sampled *without* replacement are not supported: their
    q would be the law conditioned on the earlier siblings, which no proposer here computes.

    `residual` is the update after a rejection (`rejection_residual`; tests pass subtly wrong ones to
    show the exactness tests catch them). All random numbers are drawn on ``target_probs.device`` from
    ``generator`` (which must live there). A chain reduces to standard speculative sampling.
    """
    tokens = _as_list(tokens)
    # One uniform per node, drawn up front in one call: a node is tried at most once per walk.
    uniforms = torch.rand(max(buffers.n, 1), generator=generator, device=target_probs.device).tolist()
    accepted: list[int] = []
    u = 0
    p = target_probs[0]  # [V]
    while True:
        for c in buffers.children[u]:
            x = tokens[c - 1]
            q = None if draft_probs is None else draft_probs[c - 1]  # [V]
            q_x = 1.0 if q is None else float(q[x])
            # r < p/q written without division: q_x == 0 (invalid draft) accepts iff p[x] > 0.
            if uniforms[c - 1] * q_x < float(p[x]):
                accepted.append(c)
                u = c
                p = target_probs[c]  # [V]
                break
            p = residual(p, q, x)
        else:
            bonus = int(torch.multinomial(p, 1, generator=generator))
            return Verdict(accepted, [tokens[c - 1] for c in accepted] + [bonus])
