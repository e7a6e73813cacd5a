"""scripts/bench/speculators_peer/validate_outputs.py: the decoder's answers become validation rows on their
own prompts."""

import json

import pytest
from helpers import load_script


class FakeTarget:
    def chat_ids(self, prompt: str) -> list[int]:
        return [7, len(prompt) % 50, 8]  # a stand-in template: 3 prompt tokens that depend on the prompt


def eval_dir(tmp_path, temperature: float = 0.0):
    from draftsmith.eval.measure.evaluate import EvalConfig, select_prompts

    prompts = select_prompts(EvalConfig(prompts="spec-bench", limit=2))
    (tmp_path / "summary.json").write_text(json.dumps({"prompts": "spec-bench", "temperature": temperature,
                                                       "tau": 1.5, "tree": "chain-5"}))
    (tmp_path / "samples.jsonl").write_text("".join(
        json.dumps({"id": p["id"], "output_ids": [11, 12, 13 + i]}) + "\n" for i, p in enumerate(prompts)))
    return tmp_path, prompts


def test_each_answer_follows_its_own_prompt_and_only_the_answer_is_scored(tmp_path):
    folder, prompts = eval_dir(tmp_path)
    rows = load_script("speculators_peer/validate_outputs").answers(folder, FakeTarget())
    assert [r["input_ids"] for r in rows] == [FakeTarget().chat_ids(p["prompt"]) + [11, 12, 13 + i]
                                              for i, p in enumerate(prompts)]
    assert all(r["loss_mask"] == [0, 0, 0, 1, 1, 1] for r in rows)


def test_a_sampled_eval_is_refused(tmp_path):
    """The twin: at T > 0 the answers are not the target's greedy ones, so the estimate would not be
    comparable."""
    folder, _ = eval_dir(tmp_path, temperature=1.0)
    with pytest.raises(SystemExit, match="T=0"):
        load_script("speculators_peer/validate_outputs").answers(folder, FakeTarget())
