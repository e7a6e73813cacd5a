"""No shipped recipe trains on an evaluation prompt (#59 "no recipe trains on evaluation prompts").

Every corpus a shipped recipe trains on (`data.train`, and the prompts it regenerates answers for,
`data.regenerate.prompts`) is one of the vendored training corpora, and none of those holds a Spec-Bench or
MT-bench prompt: no user turn equal to one (case, punctuation and spacing aside) and none sharing a 13-word
run with one (the n-gram test of GPT-3's contamination study, Brown et al. 2020 appendix C). The validation
split a recipe regenerates from Spec-Bench (`data.regenerate.validation_prompts`, prompts from
`validation_offset`) ranks checkpoints and never trains; its disjointness from the reported prompts is
tests/integration/test_regenerate.py's. The negative twin: one evaluation prompt inside a longer training
prompt is found.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

from draftsmith.distill.records import load_records
from draftsmith.train.config import load_config

ROOT = Path(__file__).resolve().parents[2]
EVALUATION = ("spec-bench", "mt-bench")
TRAINING = ("train-general", "train-gpteacher", "smollm2-selfdistill-4k", "smollm2-selfdistill-extra")
NEUTRAL = ("eagle3", "eagle1", "medusa", "draft", "dflash", "peagle", "dspark")
N = 13


def words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def user_turns(source: str) -> list[str]:
    records, _ = load_records([source])
    return [m["content"] for r in records for m in r["messages"] if m["role"] == "user"]


@cache
def evaluation_index() -> tuple[frozenset, frozenset]:
    """(the evaluation prompts' word sequences, their 13-word runs)."""
    turns = [t for source in EVALUATION for t in user_turns(source)]
    runs = {" ".join(w[i: i + N]) for t in turns for w in [words(t)] for i in range(len(w) - N + 1)}
    return frozenset(" ".join(words(t)) for t in turns), frozenset(runs)


def overlaps(turns: list[str]) -> list[str]:
    """The training turns that equal an evaluation prompt or share a 13-word run with one."""
    whole, runs = evaluation_index()
    found = []
    for t in turns:
        w = words(t)
        if " ".join(w) in whole or any(" ".join(w[i: i + N]) in runs for i in range(len(w) - N + 1)):
            found.append(t[:80])
    return found


def recipe_sources(path: Path) -> set[str]:
    cfg = load_config(path, ["model.target=acme/tiny"] if path.stem in NEUTRAL else [])
    named = [*cfg.data.train, *cfg.data.regenerate.prompts]
    assert all(isinstance(s, str) for s in named), f"{path.name} trains on a dataset source: check it here"
    return set(named)


def test_every_shipped_recipe_trains_on_the_checked_corpora_only():
    # a recipe's own regenerated answers come from its prompts (data.regenerate.prompts), checked here too
    for path in sorted((ROOT / "configs" / "runs").glob("*.yaml")):
        unchecked = {s for s in recipe_sources(path) if s not in TRAINING and not s.startswith("regenerated")}
        assert not unchecked, f"{path.name} trains on {unchecked}: add them to TRAINING (so this checks them)"


@pytest.mark.parametrize("source", TRAINING)
def test_no_training_corpus_holds_an_evaluation_prompt(source):
    assert overlaps(user_turns(source)) == []


def test_an_evaluation_prompt_inside_a_training_prompt_is_found():
    prompt = user_turns("mt-bench")[7]
    assert len(words(prompt)) > N
    planted = ["Write a haiku about rain.", "Before you answer, note this. " + prompt.upper() + " Thanks!"]
    assert overlaps(planted) == [planted[1][:80]]
    assert overlaps([" ".join(words(prompt)[:N - 1])]) == []  # 12 shared words: not a hit
