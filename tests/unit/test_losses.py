"""Distillation losses (`heads/losses.py`): zero for equal distributions, non-negative, JSD's symmetry and
its KL ends, temperature scaling, sparse top-k against dense, finite gradients, clear errors. Unit, CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from draftsmith.heads.losses import SOFT_LOSSES, token_loss

N, V = 40, 64


def logits(seed: int, scale: float = 3.0, dtype=torch.float64) -> torch.Tensor:
    return scale * torch.randn(N, V, generator=torch.Generator().manual_seed(seed), dtype=dtype)


SOFT = [("kl", 0.5), ("rkl", 0.5), ("tvd", 0.5), ("nla", 0.5), ("lk_hybrid", 0.5), ("jsd", 0.0), ("jsd", 0.2),
        ("jsd", 0.5), ("jsd", 1.0)]


@pytest.mark.parametrize("kind,beta", SOFT, ids=[f"{k}-{b}" for k, b in SOFT])
@pytest.mark.parametrize("temperature", [1.0, 2.5])
def test_zero_for_equal_and_nonnegative(kind, beta, temperature):
    a, b = logits(0), logits(1)
    same = token_loss(kind, a, a, beta=beta, temperature=temperature)
    assert same.shape == (N,) and same.abs().max() < 1e-5
    apart = token_loss(kind, a, b, beta=beta, temperature=temperature)
    assert (apart >= 0).all() and apart.mean() > 0.05


def reference_kl(s, t, indices=None, temperature=1.0):
    """KL(target ‖ drafter) at a temperature, scaled by T²; sparse: the target is the softmax over its kept
    logits."""
    log_q = F.log_softmax(s / temperature, -1)
    if indices is not None:
        log_q = log_q.gather(-1, indices)
    p = F.softmax(t / temperature, -1)
    return (p * (p.log() - log_q)).sum(-1) * temperature**2


def test_kl_is_forward_kl():
    s, t = logits(0), logits(1)
    p, log_q = F.softmax(t, -1), F.log_softmax(s, -1)
    forward = (p * (p.log() - log_q)).sum(-1)
    torch.testing.assert_close(token_loss("kl", s, t), forward)
    torch.testing.assert_close(token_loss("kl", s, t, temperature=2.0), reference_kl(s, t, temperature=2.0))
    q = log_q.exp()
    reverse = (q * (log_q - F.log_softmax(t, -1))).sum(-1)
    torch.testing.assert_close(token_loss("rkl", s, t), reverse)
    torch.testing.assert_close(token_loss("tvd", s, t), 0.5 * (p - q).abs().sum(-1))


def test_jsd_symmetric_at_half_and_the_kls_at_its_ends():
    s, t = logits(2), logits(3)
    torch.testing.assert_close(token_loss("jsd", s, t, beta=0.5), token_loss("jsd", t, s, beta=0.5))
    assert not torch.allclose(token_loss("jsd", s, t, beta=0.2), token_loss("jsd", t, s, beta=0.2))
    fkl, rkl = token_loss("kl", s, t), token_loss("rkl", s, t)
    torch.testing.assert_close(token_loss("jsd", s, t, beta=1e-9), fkl, rtol=1e-3, atol=1e-6)  # a limit ...
    torch.testing.assert_close(token_loss("jsd", s, t, beta=1 - 1e-9), rkl, rtol=1e-3, atol=1e-6)
    torch.testing.assert_close(token_loss("jsd", s, t, beta=0.0), fkl)  # ... and its value at the end
    torch.testing.assert_close(token_loss("jsd", s, t, beta=1.0), rkl)
    p, q = F.softmax(t, -1), F.softmax(s, -1)
    m = (p + q) / 2
    plain = 0.5 * (p * (p / m).log()).sum(-1) + 0.5 * (q * (q / m).log()).sum(-1)
    torch.testing.assert_close(token_loss("jsd", s, t, beta=0.5), 4 * plain)  # rescaled by 1 / (β(1-β))


@pytest.mark.parametrize("kind", SOFT_LOSSES)
def test_temperature_scales_by_its_square(kind):
    s, t = logits(4), logits(5)
    torch.testing.assert_close(token_loss(kind, s, t, temperature=2.0),
                               4 * token_loss(kind, s / 2, t / 2))


def sparse(t: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    return t.topk(k, dim=-1)  # values [N, k], indices [N, k]


@pytest.mark.parametrize("kind,beta", SOFT, ids=[f"{k}-{b}" for k, b in SOFT])
def test_sparse_equals_dense_when_k_is_the_vocabulary(kind, beta):
    s, t = logits(6), logits(7)
    values, indices = sparse(t, V)
    # the order of the kept k is irrelevant
    perm = torch.randperm(V, generator=torch.Generator().manual_seed(0))
    got = token_loss(kind, s, values[:, perm], indices[:, perm], beta=beta, temperature=1.5)
    torch.testing.assert_close(got, token_loss(kind, s, t, beta=beta, temperature=1.5), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind,beta",
                         [("kl", 0.5), ("tvd", 0.5), ("nla", 0.5), ("lk_hybrid", 0.5), ("jsd", 0.3),
                                       ("jsd", 0.0)])
def test_sparse_is_the_full_divergence_to_a_target_zero_outside_its_top_k(kind, beta):
    """kl, tvd, nla, lk_hybrid and jsd over the whole vocabulary: the rest bucket is exact, not an
    approximation."""
    s, t = logits(8), logits(9)
    values, indices = sparse(t, 8)
    truncated = torch.full_like(t, float("-inf")).scatter(-1, indices, values)  # [N, V]: -inf off the top-k
    torch.testing.assert_close(token_loss(kind, s, values, indices, beta=beta),
                               token_loss(kind, s, truncated, beta=beta), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(token_loss("kl", s, values, indices), reference_kl(s, values, indices))


def test_acceptance_losses_are_the_lk_losses():
    """nla = -log α with α = 1 - TVD, its gradient TVD's divided by α (the point of it: no vanishing gradient
    far from the target); a one-hot target makes it cross-entropy; lk_hybrid = λ KL + (1 - λ) TVD, λ =
    exp(-3α), with no gradient through λ."""
    t = logits(16)
    s1, s2 = logits(15).requires_grad_(), logits(15).requires_grad_()
    tvd, nla = token_loss("tvd", s1, t), token_loss("nla", s2, t)
    accept = 1 - tvd.detach()
    torch.testing.assert_close(nla, -accept.log())
    tvd.sum().backward()
    nla.sum().backward()
    torch.testing.assert_close(s2.grad, s1.grad / accept[:, None])
    labels = torch.randint(0, V, (N,), generator=torch.Generator().manual_seed(1))
    one_hot = torch.full((N, V), float("-inf"), dtype=torch.float64).scatter(-1, labels[:, None], 0.0)
    torch.testing.assert_close(token_loss("nla", s1, one_hot), token_loss("ce", s1, labels=labels).double())
    s3 = logits(15).requires_grad_()
    blend = torch.exp(-3 * accept)
    hybrid = token_loss("lk_hybrid", s3, t)
    torch.testing.assert_close(hybrid, blend * token_loss("kl", s3, t) + (1 - blend) * tvd.detach())
    hybrid.sum().backward()
    s4 = logits(15).requires_grad_()
    (blend * token_loss("kl", s4, t) + (1 - blend) * token_loss("tvd", s4, t)).sum().backward()
    torch.testing.assert_close(s3.grad, s4.grad)  # λ held fixed: the gradients are the blend of the two


def test_sparse_reverse_kl_renormalises_the_drafter_on_the_kept_tokens():
    s, t = logits(10), logits(11)
    values, indices = sparse(t, 8)
    log_q = F.log_softmax(s.gather(-1, indices), -1)  # the drafter restricted to the kept 8
    expected = (log_q.exp() * (log_q - F.log_softmax(values, -1))).sum(-1)
    torch.testing.assert_close(token_loss("rkl", s, values, indices), expected)
    assert token_loss("rkl", s, values, indices).isfinite().all()


@pytest.mark.parametrize("kind,beta", SOFT, ids=[f"{k}-{b}" for k, b in SOFT])
@pytest.mark.parametrize("k", [None, 8])
def test_gradients_finite_with_extreme_logits(kind, beta, k):
    """Probabilities that underflow to 0 (logit gaps of hundreds) must not turn into nan gradients."""
    s = (logits(12, scale=80.0, dtype=torch.float32)).requires_grad_()
    t = logits(13, scale=80.0, dtype=torch.float32)
    values, indices = sparse(t, k) if k else (t, None)
    loss = token_loss(kind, s, values, indices, beta=beta).mean()
    loss.backward()
    assert loss.isfinite() and s.grad.isfinite().all()


def test_ce_and_errors():
    s, labels = logits(14), torch.randint(0, V, (N,), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(token_loss("ce", s, labels=labels),
                               F.cross_entropy(s.float(), labels, reduction="none"))
    with pytest.raises(ValueError, match="'ce' needs the next tokens"):
        token_loss("ce", s)
    with pytest.raises(ValueError, match="'jsd' needs the target's logits.*extract.enabled: false"):
        token_loss("jsd", s, labels=labels)
    with pytest.raises(ValueError,
                       match="drafter.loss 'mse' unknown; valid: ce, kl, rkl, jsd, tvd, nla, lk_hybrid"):
        token_loss("mse", s, s)
    with pytest.raises(ValueError, match="drafter.jsd_beta"):
        token_loss("jsd", s, s, beta=1.5)


def test_chain_weights_are_the_gradient_of_the_expected_accepted_length():
    """W_i = d/ds_i sum_m prod_{j<=m} s_j (autograd), zeros included: a position after a chance-0 one weighs
    nothing, and the weights of a chain that always accepts are k, k-1, ..., 1."""
    from draftsmith.heads.losses import chain_weights

    s = torch.rand(4, 3, 5, generator=torch.Generator().manual_seed(0))
    s[0, 0, 2] = 0.0
    s[1, 1, 0] = 0.0
    leaf = s.clone().requires_grad_(True)
    expected = leaf.cumprod(-1).sum()
    (grad,) = torch.autograd.grad(expected, leaf)
    weights = chain_weights(s)
    assert torch.allclose(weights, grad, atol=1e-6)
    assert (weights[0, 0, 3:] == 0).all() and (weights[1, 1, 1:] == 0).all()
    assert chain_weights(torch.ones(5)).tolist() == [5.0, 4.0, 3.0, 2.0, 1.0]


def test_dpace_weights_are_the_softened_expected_length_from_each_slot_on():
    """D-PACE (speculators losses/utils.py dpace_loss_decay): s' = 0.5 s + 0.5, W_t = sum_{m>=t}
    prod_{j<=m} s'_j; an uncounted slot weighs 0 and passes its block on unchanged (s' = 1); a chance-0 slot
    does not silence the slots after it (the twin: chain_weights does)."""
    from draftsmith.heads.losses import chain_weights, dpace_weights

    s = torch.tensor([[0.8, 0.0, 0.6, 0.4], [1.0, 0.5, 0.5, 0.0]])
    counted = torch.tensor([[True, True, True, True], [True, False, True, True]])
    sp = [[0.9, 0.5, 0.8, 0.7], [1.0, 1.0, 0.75, 0.5]]
    want = torch.zeros(2, 4)
    for b in range(2):
        prefix = torch.tensor(sp[b]).cumprod(0) * counted[b]
        for t in range(4):
            want[b, t] = prefix[t:].sum() * counted[b, t]
    got = dpace_weights(s, counted)
    assert torch.allclose(got, want) and got[1, 1] == 0
    assert (got[0, 2:] > 0).all() and (chain_weights(s)[0, 2:] == 0).all()
    assert dpace_weights(torch.ones(5), torch.ones(5, dtype=torch.bool)).tolist() == [5.0, 4.0, 3.0, 2.0, 1.0]
