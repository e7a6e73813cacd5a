"""scripts/bench/validation_gap.py: training's validation step (the drafter through LossModule, then serving_tau) on
rows given to it, for a drafter loaded outside training."""

import torch
from helpers import load_script

from draftsmith.heads.registry import DrafterConfig, build_drafter
from draftsmith.train.runtime import build_accelerator
from draftsmith.train.sources import OnlineSource


def test_estimates_run_trainings_validation_on_a_bare_drafter(tiny_target):
    torch.manual_seed(0)
    drafter = build_drafter(DrafterConfig.for_kind("eagle"), tiny_target.model)  # the tiny target is too shallow for eagle3
    source = OnlineSource(tiny_target, list(drafter.feature_layers), 16)
    rows = [{"input_ids": torch.randint(3, 200, (n,)).tolist(), "loss_mask": [0] * 4 + [1] * (n - 4)}
            for n in (12, 9, 15)]
    d_cfg = DrafterConfig.for_kind("eagle", num_speculative_tokens=5, tree_nodes=16, tree_topk=4)
    with torch.no_grad():
        est = load_script("validation_gap").estimates(drafter.eval(), rows, source, build_accelerator(), 2, d_cfg)
    assert est["sequences"] == 3 and est["tokens"] == 8 + 5 + 11
    assert 1.0 <= est["chain5_from_ranks"] <= est["expected_tau_serving"] <= 6.0  # a tree holds the chain
    assert 1.0 <= est["expected_tau_joint"] <= 6.0
