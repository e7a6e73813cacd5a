"""scripts/bench/onpolicy_ceiling/onpolicy_ceiling.py: teacher-forced agreement of answers with the target's
argmax, and the share of each training-time-test depth whose drafted prefix is one a T=0 verification
accepts."""

import torch
from helpers import load_script


def greedy_row(model, prompt: list[int], n: int) -> dict:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return {"input_ids": ids, "loss_mask": [0] * len(prompt) + [1] * n}


def test_the_targets_own_greedy_answers_are_on_policy_at_every_depth(tiny_target):
    model = tiny_target.model
    rows = [greedy_row(model, [5, 17, 40], 9), greedy_row(model, [3, 8], 6)]
    got = load_script("onpolicy_ceiling/onpolicy_ceiling").agreement(model, rows, depth=4)
    assert got["answer_tokens"] == 15 and got["token_agreement"] == 1.0 and got["answers_identical"] == 1.0
    assert got["onpolicy_share"] == [1.0] * 4
    # depth j counts answer labels x_p with a base p-2-j >= 0, as training-time test does (prompt tokens are
    # given)
    assert got["counted"] == [9 + 6, 9 + 5, 8 + 4, 7 + 3]


def test_one_token_off_the_argmax_takes_exactly_the_depths_that_draft_past_it(tiny_target):
    """Negative twin: answer token 4 of 9 (position p = 7) is not the target's argmax there, and the target's
    greedy continuation of that follows it. Depth 0 keeps every label on-policy; depth j loses the j labels
    p+1..p+j (their drafted prefix holds p)."""
    model = tiny_target.model
    p = 7
    head = greedy_row(model, [5, 17, 40], 4)["input_ids"]  # prompt + 4 answer tokens: positions 0..6
    with torch.no_grad():
        argmax = int(model(input_ids=torch.tensor([head])).logits[0, -1].argmax())
    tail = greedy_row(model, head + [(argmax + 1) % model.config.vocab_size], 4)["input_ids"]
    row = {"input_ids": tail, "loss_mask": [0] * 3 + [1] * 9}
    assert len(tail) == 12 and tail[p] != argmax
    got = load_script("onpolicy_ceiling/onpolicy_ceiling").agreement(model, [row], depth=4)
    assert got["token_agreement"] < 1.0 and got["answers_identical"] == 0.0
    assert got["onpolicy_share"][0] == 1.0
    assert got["token_agreement"] == 8 / 9
    assert got["counted"] == [9, 9, 8, 7]
    assert got["onpolicy_share"][1:] == [(9 - 1) / 9, (8 - 2) / 8, (7 - 3) / 7]


def test_the_page_shows_each_dtype_and_depth():
    data = {"config": "smollm2-eagle3", "data": ["a", "b"], "seed": 0, "depth": 3,
            "dtypes": {"float32": {"sequences": 4, "answer_tokens": 1000, "token_agreement": 0.9876,
                                   "answers_identical": 0.5, "onpolicy_share": [1.0, 0.98, 0.96]}}}
    page = "\n".join(load_script("onpolicy_ceiling/page").render_onpolicy_ceiling(data))
    assert "| float32 | 0.9876 | 0.500 | 1.000 | 0.980 | 0.960 |" in page
    assert "on-policy share, depth 2" in page and "1,000 answer tokens" in page
