"""scripts/bench/validation_gap/: validation_gap.py runs training's validation step (the drafter through
LossModule, then serving_tau) on rows given to it, for a drafter loaded outside training; page.py renders its
JSON."""

import torch
from helpers import load_script

from draftsmith.heads.registry import DrafterConfig, build_drafter
from draftsmith.train.runtime import build_accelerator
from draftsmith.train.sources import OnlineSource


def test_estimates_run_trainings_validation_on_a_bare_drafter(tiny_target):
    torch.manual_seed(0)
    # the tiny target is too shallow for eagle3
    drafter = build_drafter(DrafterConfig.for_kind("eagle"), tiny_target.model)
    source = OnlineSource(tiny_target, list(drafter.feature_layers), 16)
    rows = [{"input_ids": torch.randint(3, 200, (n,)).tolist(), "loss_mask": [0] * 4 + [1] * (n - 4)}
            for n in (12, 9, 15)]
    d_cfg = DrafterConfig.for_kind("eagle", num_speculative_tokens=5, tree_nodes=16, tree_topk=4)
    with torch.no_grad():
        est = load_script("validation_gap/validation_gap").estimates(drafter.eval(), rows, source,
                                                                     build_accelerator(),
                                                                      2, d_cfg)
    assert est["sequences"] == 3 and est["tokens"] == 8 + 5 + 11
    assert 1.0 <= est["chain5_from_ranks"] <= est["expected_tau_serving"] <= 6.0  # a tree holds the chain
    assert 1.0 <= est["expected_tau_joint"] <= 6.0


def test_the_validation_gap_page_renders_both_splits_and_the_ratios():
    """validation_gap.py's JSON -> its page: per row the measured τ beside the estimate on each split."""
    est = lambda tree, chain: {"sequences": 160, "tokens": 19000, "expected_tau_serving": tree,  # noqa: E731
                               "expected_tau_joint": chain}
    row = {"steps": 300, "logged": {"expected_tau_serving": 1.878},
           "held_out": est(1.875, 1.551), "eval_distribution": est(1.52, 1.23),
           "measured": {"dynamic-16": {"tau": 1.4745, "prompts": 40, "dtype": "bfloat16"},
                        "chain-5": {"tau": 1.2193, "prompts": 40, "dtype": "bfloat16"}},
           "ratio": {"held_out": {"dynamic-16": 1.2716, "chain-5": 1.272},
                     "eval_distribution": {"dynamic-16": 1.0309, "chain-5": 1.0088}}}
    page = "\n".join(load_script("validation_gap/page").render_validation_gap(
        {"data": "/tmp/x/regenerated-validation.jsonl", "data_line": "160/160 records kept", "notes": [],
         "rows": {"eagle3": row}}))
    assert ("| eagle3 | 300 | 1.474 | 1.875 (1.272) | 1.520 (1.031) | 1.219 | 1.551 (1.272) | 1.230 (1.009) "
            "|" in page)
    assert "within 0.003 τ" in page and "160 conversations (19,000 answer tokens)" in page
