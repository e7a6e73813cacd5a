"""The acceptance tally's simulations (`heads/runtime/acceptance.py`): rank accuracies as validation metrics,
and the simulated τ of a serving chain or tree that `train.select` chooses by, for recurrent drafters and
fixed heads; the EAGLE and Medusa drafters report rank accuracies in eval mode only. Unit, CPU."""

from __future__ import annotations

import pytest
import torch
from helpers import build_tiny_model, features_of

from draftsmith.heads.medusa.model import MedusaHeads
from draftsmith.heads.registry import DrafterConfig, build_drafter
from draftsmith.heads.runtime.acceptance import (
    RANK_KEY,
    chain_tau,
    optimal_tree,
    paths_tau,
    rank_matrix,
    rank_metrics,
    serving_tau,
)

ACC = [[0.6, 0.2, 0.1], [0.5, 0.2, 0.05], [0.4, 0.1, 0.05]]


def as_metrics(acc):
    return {RANK_KEY.format(depth=d, rank=r): a for d, row in enumerate(acc) for r, a in enumerate(row)}


def test_rank_metrics_count_hits_per_rank_and_read_back_as_a_matrix():
    candidates = torch.tensor([[5, 6, 7], [1, 2, 3], [9, 8, 7], [4, 0, 0]])
    labels = torch.tensor([6, 1, 0, 4])  # rank 1, rank 0, none, rank 0
    metrics = rank_metrics(2, candidates, labels)
    assert metrics == {"rank_acc/2/0": 0.5, "rank_acc/2/1": 0.25, "rank_acc/2/2": 0.0}
    assert rank_metrics(0, torch.zeros(0, 2, dtype=torch.long), torch.zeros(0, dtype=torch.long)) == \
        {"rank_acc/0/0": 0.0, "rank_acc/0/1": 0.0}
    assert rank_matrix(dict(as_metrics(ACC), loss=1.0, expected_tau=2.0)) == ACC
    assert rank_matrix({"loss": 1.0}) == [] and serving_tau({"loss": 1.0}, 5, 16, 4) is None


def test_serving_tau_simulates_the_chain_or_tree_the_config_serves():
    metrics = as_metrics(ACC)
    # a chain (no tree budget): rank 0 at every depth, the last measured depth standing in for deeper ones
    assert serving_tau(metrics, 5, 0, 4) == pytest.approx(chain_tau([0.6, 0.5, 0.4], 5))
    # a tree budget: the best tree of that many nodes, children limited to the top-k ranks, any depth
    deep = [ACC[0][:2], ACC[1][:2], ACC[2][:2], ACC[2][:2]]
    assert serving_tau(metrics, 4, 6, 2) == pytest.approx(optimal_tree(deep, 6)[1])
    # one child a node: a 4-chain at most
    assert serving_tau(metrics, 4, 6, 1) < serving_tau(metrics, 4, 6, 2)
    # fixed heads draft only as deep as they are, and their static tree may take any measured rank
    assert serving_tau(metrics, 5, 0, 1, recurrent=False) == pytest.approx(chain_tau([0.6, 0.5, 0.4], 3))
    paths, tau = optimal_tree(ACC, 6)
    assert (serving_tau(metrics, 5, 6, 1,
                        recurrent=False) == pytest.approx(tau) == pytest.approx(paths_tau(paths, ACC)))


def test_eagle_reports_rank_accuracies_in_eval_mode_only():
    target = build_tiny_model("llama", layers=6)
    counts = torch.arange(259).flip(0) * 3 % 101
    d = build_drafter(DrafterConfig.for_kind("eagle3", draft_vocab=100, ttt_steps=3), target, counts)
    ids = torch.randint(3, 259, (2, 12), generator=torch.Generator().manual_seed(0))
    feats, logits = features_of(target, d, ids)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids),
             "features": {k: v.detach() for k, v in feats.items()}, "target_logits": logits.detach()}
    _, train_metrics = d.compute_loss(batch)
    assert not rank_matrix(train_metrics)
    d.eval()
    with torch.no_grad():
        _, metrics = d.compute_loss(batch)
    acc = rank_matrix(metrics)
    assert len(acc) == 3 and len(acc[0]) == 8  # TTT steps x ranks
    # rank 0 is the top-1 accuracy; siblings are exclusive, so the ranks add up to at most 1
    for j in range(3):
        assert acc[j][0] == pytest.approx(metrics[f"acc_top1/step{j}"]) and sum(acc[j]) <= 1 + 1e-6


def test_medusa_reports_rank_accuracies_per_head_in_eval_mode_only():
    heads = MedusaHeads(16, 50, num_heads=3)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (2, 10), generator=g)
    batch = {"input_ids": ids, "loss_mask": torch.ones_like(ids), "attention_mask": torch.ones_like(ids),
             "features": {"final": torch.randn(2, 10, 16, generator=g)},
             "target_logits": torch.randn(2, 10, 50, generator=g)}
    assert not rank_matrix(heads.compute_loss(batch)[1])
    heads.eval()
    with torch.no_grad():
        _, metrics = heads.compute_loss(batch)
    acc = rank_matrix(metrics)
    assert len(acc) == 3 and len(acc[0]) == 8
    assert [row[0] for row in acc] == pytest.approx([metrics[f"acc_top1/head{k}"] for k in range(3)])
    assert MedusaHeads.recurrent is False
