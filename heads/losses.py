"""The one divergence module: token-level losses of every trainable drafter kind against the target.

In the flow: a drafter's `compute_loss` (Medusa heads, EAGLE drafters, draft LMs) compares its
logits at counted positions with the target's distribution there, dense `[N, V]` (online) or sparse
top-k `[N, k]` + indices (offline shards). `token_loss` returns one value per position `[N]`; the
caller masks and averages.

`token_loss(kind, ...)` is the one entry point (DistillSpec's divergences, p = target, q = drafter):

- `kl`  forward KL(p ‖ q) (mass-covering; what Medusa and EAGLE use),
- `rkl` reverse KL(q ‖ p) (mode-seeking),
- `jsd` generalised JSD_β = β·KL(p ‖ m) + (1-β)·KL(q ‖ m), m = βp + (1-β)q, divided by β(1-β):
        without that factor both ends vanish; with it β → 0 is forward KL and β → 1 reverse KL,
        and β = 0.5 is 4·JSD (symmetric),
- `tvd` total variation ½·Σ|p - q| (1 - TVD is the acceptance rate of speculative sampling),
- `nla` negative log-acceptance -log α, α = Σ min(p, q) = 1 - TVD: TVD's gradient times 1/α, so it does not
        vanish while the drafter is far off (LK losses, Samarin et al. 2026, arXiv 2602.23881),
- `lk_hybrid` λ·KL(p ‖ q) + (1-λ)·TVD with λ = exp(-η·α), α not differentiated (η = `LK_ETA` = 3, the
        paper's best): KL's strong gradient while acceptance is low, acceptance itself once it is not
        (both as speculators 0.9.0 `losses/eager.py` names them),
- `ce`  cross-entropy on the next token (hard labels, no temperature).

Soft losses use `temperature` on both sides and are scaled by temperature² (Hinton). A sparse target
is the softmax over its k kept logits and zero elsewhere (a kept logit of -inf is a zero too); kl, jsd and tvd
are then the exact full-vocabulary divergences (the drafter's mass outside the k kept tokens enters as
one "rest" bucket; so are nla and lk_hybrid, whose α gets nothing from the rest), while rkl, infinite
whenever the drafter puts mass outside them, is taken on the k
kept tokens with the drafter renormalised there. With k = V, sparse equals dense for every kind.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

SOFT_LOSSES = ("kl", "rkl", "jsd", "tvd", "nla", "lk_hybrid")
LK_ETA = 3.0  # lk_hybrid's blend temperature (LK losses' best hybrid setting)
TOKEN_LOSSES = ("ce", *SOFT_LOSSES)


def to_draft_index(t2d: torch.Tensor) -> torch.Tensor:
    """A reduced draft vocabulary's map target id -> draft id `[V]` (valid where `t2d [V]`, the vocabulary's
    mask)."""
    return torch.cumsum(t2d.long(), 0) - 1


def restrict_topk(values: torch.Tensor, indices: torch.Tensor,
                  t2d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's top-k `(values, target ids)` on a reduced draft vocabulary: ids outside it get value -inf
    (no support), the rest their draft ids. A row whose top-k holds no draft token is all -inf: leave it
    out."""
    keep = t2d[indices]
    return values.masked_fill(~keep, float("-inf")), torch.where(keep, to_draft_index(t2d)[indices],
                                                                 torch.zeros_like(indices))


def _log_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """log-softmax in at least fp32 (fp64 stays fp64, so tests can check limits tightly)."""
    return F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature, dim=-1)


def _sparse_pair(log_q: torch.Tensor, log_p: torch.Tensor, indices: torch.Tensor, renormalise: bool):
    """Drafter log-probs `[N, V]` and the target's over its k kept tokens `[N, k]` -> one common support:
    the k kept tokens (drafter renormalised there) or the k kept + one rest bucket `[N, k+1]`."""
    kept = log_q.gather(-1, indices.long())  # [N, k]
    if renormalise:  # over the kept tokens the target gives mass (a kept logit of -inf is no support)
        kept = kept.masked_fill(torch.isneginf(log_p), float("-inf"))
        return kept - kept.logsumexp(-1, keepdim=True), log_p
    # the rest never reaches exactly 0: its log stays finite, and so do the gradients
    rest = (1 - kept.exp().sum(-1, keepdim=True)).clamp_min(torch.finfo(kept.dtype).tiny).log()  # [N, 1]
    no_mass = torch.full_like(rest, float("-inf"))
    return torch.cat([kept, rest], -1), torch.cat([log_p, no_mass], -1)  # [N, k+1] each


def _kl(log_a: torch.Tensor, log_b: torch.Tensor) -> torch.Tensor:
    """KL(a ‖ b) from log-probs over the last dim; b must be > 0 wherever a is."""
    a = log_a.exp()
    # a = 0 contributes 0: without the where, 0 * -inf is nan (forward, or backward when exp underflows);
    # log_b too, where b = 0 as well (a token neither side gives mass)
    log_a = torch.where(a > 0, log_a, torch.zeros_like(log_a))
    log_b = torch.where(a > 0, log_b, torch.zeros_like(log_b))
    return (a * (log_a - log_b)).sum(-1)  # [N]


def token_loss(kind: str, student_logits: torch.Tensor, teacher_logits: torch.Tensor | None = None,
               teacher_indices: torch.Tensor | None = None, labels: torch.Tensor | None = None,
               beta: float = 0.5, temperature: float = 1.0) -> torch.Tensor:
    """Per-position loss `[N]` of drafter logits `[N, V]` against the target (see the module doc).

    teacher_logits `[N, V]` (dense) or `[N, k]` with `teacher_indices [N, k]` (sparse top-k); labels `[N]`
    (next tokens) for `ce`. `beta` is JSD's β in [0, 1].
    """
    if kind not in TOKEN_LOSSES:
        raise ValueError(f"drafter.loss '{kind}' unknown; valid: {', '.join(TOKEN_LOSSES)}")
    if kind == "ce":
        if labels is None:
            raise ValueError("drafter.loss 'ce' needs the next tokens (labels)")
        return F.cross_entropy(student_logits.float(), labels, reduction="none")  # [N]
    if teacher_logits is None:
        raise ValueError(f"drafter.loss '{kind}' needs the target's logits: train online (extract.enabled: "
                         "false) or extract top-k logits (extract.top_k_logits > 0), or use drafter.loss: ce")
    if not 0 <= beta <= 1 or temperature <= 0:
        raise ValueError(f"need 0 <= drafter.jsd_beta <= 1 (got {beta}) and drafter.distill_temperature > 0 "
                         f"(got {temperature})")
    if kind == "jsd" and beta in (0, 1):  # the limits of the rescaled JSD (the formula is 0/0 there)
        kind = "kl" if beta == 0 else "rkl"
    log_q = _log_probs(student_logits, temperature)  # [N, V]
    if kind == "kl":  # Σ p log p - p log q over the target's support (sparse: the k kept tokens)
        if teacher_indices is not None:
            log_q = log_q.gather(-1, teacher_indices.long())  # [N, k]
        p = F.softmax(teacher_logits.to(log_q.dtype) / temperature, dim=-1)  # [N, V] or [N, k]
        # xlogy: a target probability of exactly 0 (logit -inf) contributes 0, not nan
        return (torch.xlogy(p, p) - p * log_q).sum(-1) * temperature**2  # [N]
    log_p = _log_probs(teacher_logits, temperature)  # [N, V] or [N, k]
    if teacher_indices is not None:
        log_q, log_p = _sparse_pair(log_q, log_p, teacher_indices, renormalise=kind == "rkl")
    if kind == "rkl":
        loss = _kl(log_q, log_p)
    elif kind == "tvd":
        loss = 0.5 * (log_p.exp() - log_q.exp()).abs().sum(-1)
    elif kind in ("nla", "lk_hybrid"):
        accept = torch.minimum(log_p.exp(), log_q.exp()).sum(-1)  # α [N]: the acceptance rate of q against p
        if kind == "nla":
            loss = -accept.clamp_min(torch.finfo(accept.dtype).tiny).log()
        else:  # KL(p ‖ q) on the same support (sparse: kept + rest, where p is 0), no second softmax
            blend = torch.exp(-LK_ETA * accept.detach())  # λ: how far from acceptable this position still is
            loss = blend * _kl(log_p, log_q) + (1 - blend) * (1 - accept)
    else:
        log_m = torch.logaddexp(log_p + math.log(beta), log_q + math.log1p(-beta))  # log(βp + (1-β)q)
        loss = (beta * _kl(log_p, log_m) + (1 - beta) * _kl(log_q, log_m)) / (beta * (1 - beta))
    return loss * temperature**2  # [N]


DPACE_ALPHA = 0.5  # D-PACE's confidence smoothing (speculators' and SpecForge's default)


def dpace_weights(accept: torch.Tensor, counted: torch.Tensor, alpha: float = DPACE_ALPHA) -> torch.Tensor:
    """D-PACE's position weights `W [.., k]` from each slot's acceptance `accept [.., k]` (no gradient) where
    `counted [.., k]`: every slot's confidence softened to s' = (1 - alpha) s + alpha (an uncounted slot: 1),
    W_t = sum_{m >= t} prod_{j <= m} s'_j over the counted slots m — the expected accepted length from slot t
    on, a slot's own chance included and never below alpha^k, so no slot stops training while the drafter is
    far off (unlike `chain_weights`' exact derivative). Read from vllm-project/speculators
    src/speculators/losses/utils.py `dpace_loss_decay` (commit c05b95b, 2026-08), whose confidence is
    exp(-CE), the drafter's probability of the label; here the exact acceptance sum min(p, q), which is that
    where the target is one-hot. The caller divides by the number of counted slots, as D-PACE does, not by
    sum W."""
    c = counted.to(accept.dtype)
    smooth = torch.where(counted, (1 - alpha) * accept + alpha, torch.ones_like(accept))
    return (smooth.cumprod(-1) * c).flip(-1).cumsum(-1).flip(-1) * c


def position_weights(rule: str, accept: torch.Tensor, counted: torch.Tensor) -> torch.Tensor:
    """A block's position weights by `rule`: acceptance (`chain_weights`) or dpace (`dpace_weights`)."""
    return dpace_weights(accept, counted) if rule == "dpace" else chain_weights(accept)


def lookup_predicted(ids: torch.Tensor, ngram_max: int = 3, ngram_min: int = 1) -> torch.Tensor:
    """`[B, T]` bool: token t is what prompt lookup over the sequence's own prefix ids[:t] drafts first -- the
    token after the latest earlier occurrence of the longest suffix n-gram (ngram_max down to ngram_min) that
    recurs (heads/prompt_lookup/proposer.py's chain, datastore aside). Training weighs such positions less
    (`drafter.lookup_weight`): a free n-gram draft already proposes them when a lookup branch is served.
    Vectorised over an `[B, T, T]` match table (T = 384: 0.6 M booleans per sequence)."""
    B, T = ids.shape
    out = torch.zeros(B, T, dtype=torch.bool, device=ids.device)
    if T < 2:
        return out
    eq = ids[:, :, None] == ids[:, None, :]  # [B, e, e']: token e equals token e'
    earlier = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril(-1)  # e' < e
    match = eq.clone()  # suffixes of length n ending at e and at e' agree
    found = torch.zeros(B, T, dtype=torch.bool, device=ids.device)
    pred = torch.full((B, T), -1, dtype=ids.dtype, device=ids.device)  # the drafted token after position e
    index = torch.arange(T, device=ids.device)
    by_n = {}
    for n in range(1, ngram_max + 1):
        if n > 1:  # extend by one token back: e-n+1 == e'-n+1 (and both exist)
            shifted = torch.zeros_like(match)
            shifted[:, n - 1:, n - 1:] = eq[:, :T - n + 1, :T - n + 1]
            match = match & shifted
        if n >= ngram_min:
            by_n[n] = match & earlier
    for n in range(ngram_max, ngram_min - 1, -1):  # the longest n-gram with a match wins
        ok = by_n[n].any(-1) & ~found  # [B, e]
        latest = torch.where(by_n[n], index, -1).max(-1).values  # [B, e]: the latest e'
        cont = ids.gather(1, (latest + 1).clamp(max=T - 1))
        pred = torch.where(ok, cont, pred)
        found |= ok
    out[:, 1:] = found[:, :-1] & (pred[:, :-1] == ids[:, 1:])
    return out


def weighted_mean(values: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """mean of `values [N]`, weighted by `weights [N]` when given."""
    if weights is None:
        return values.mean()
    return (values * weights).sum() / weights.sum().clamp_min(1e-12)


def chain_weights(accept: torch.Tensor) -> torch.Tensor:
    """Position weights from exact acceptance: `accept [.., k]` the chance each drafted position is accepted
    given the ones before it (no gradient) -> `W [.., k]`, W_i = d E[accepted] / d s_i = P(reach i) x (1 +
    the expected accepted after i), with E[accepted] = sum_m prod_{j<=m} s_j; so a loss sum_i W_i l_i whose
    l_i falls as s_i rises (tvd: l_i = 1 - s_i) follows the gradient of the expected accepted length, the
    position weights of D-PACE / D-PARD (SpecForge) written from that expectation. A position after one of
    chance 0 gets weight 0."""
    k = accept.shape[-1]
    reach = torch.cat([torch.ones_like(accept[..., :1]), accept[..., :-1].cumprod(-1)], -1)  # prod_{j<i} s_j
    after = torch.ones_like(accept)  # R_i = 1 + s_{i+1} R_{i+1}, R_k = 1
    for i in range(k - 2, -1, -1):
        after[..., i] = 1 + accept[..., i + 1] * after[..., i + 1]
    return reach * after
