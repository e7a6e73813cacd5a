"""Offline builders for tests: a byte-level ChatML tokenizer and tiny random HF causal LMs on disk.

Nothing here downloads. `build_tiny_tokenizer()` is a 259-token byte-level BPE (3 specials + 256
bytes, no merges) wrapped in `PreTrainedTokenizerFast` with SmolLM2's ChatML template, so any text
round-trips. `build_tiny_model_dir(...)` saves a tiny Llama or Qwen2 (hidden 32, vocab 259) plus
that tokenizer to a folder that `draftsmith.distill.target.load_target(str(folder))` loads exactly
like a real target folder; `<|im_end|>` is eos and pad.
"""

from __future__ import annotations

from pathlib import Path

import torch

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
IM_START, IM_END = 1, 2

# SmolLM2-135M-Instruct's ChatML template (adds a default system turn when none is given).
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

TINY_SIZES = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2)


def build_tiny_tokenizer():
    """Byte-level ChatML tokenizer: encodes any text, `<|im_end|>` is eos and pad."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<|im_start|>", eos_token="<|im_end|>",
        pad_token="<|im_end|>", unk_token="<|endoftext|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_model(family: str = "llama", layers: int = 2, seed: int = 0, vocab_size: int = 259):
    """A tiny random Llama/Qwen2 causal LM in fp32 (eos/pad = `<|im_end|>`)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    families = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}
    if family not in families:
        raise ValueError(f"family '{family}' unknown; use one of {', '.join(families)}")
    config_cls, model_cls = families[family]
    # initializer_range 0.2 (not 0.02) makes next-token logits peaked, so greedy argmax is far from
    # ties and batched vs unbatched comparisons are not at the mercy of float rounding.
    config = config_cls(**TINY_SIZES, num_hidden_layers=layers, vocab_size=vocab_size, initializer_range=0.2,
                        bos_token_id=IM_START, eos_token_id=IM_END, pad_token_id=IM_END,
                        max_position_embeddings=1024)
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    model.generation_config.eos_token_id = IM_END
    model.generation_config.pad_token_id = IM_END
    model.generation_config.bos_token_id = IM_START
    return model


def build_tiny_model_dir(tmp_path, family: str = "llama", layers: int = 2, seed: int = 0) -> Path:
    """Save a tiny model + the tiny tokenizer under `tmp_path/<family>-L<layers>-s<seed>`; returns the folder."""
    folder = Path(tmp_path) / f"tiny-{family}-L{layers}-s{seed}"
    if (folder / "config.json").is_file():
        return folder
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(family, layers, seed, vocab_size=len(tokenizer))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square p-value of observed `counts` against cell probabilities (sparse cells pooled)."""
    expected = probs.double().flatten() * counts.sum()
    observed = counts.double().flatten()
    small = expected < 5
    if small.any():
        expected = torch.cat([expected[~small], expected[small].sum().reshape(1)])
        observed = torch.cat([observed[~small], observed[small].sum().reshape(1)])
    stat = ((observed - expected) ** 2 / expected).sum()
    df = torch.tensor(len(expected) - 1, dtype=torch.float64)
    return float(torch.special.gammaincc(df / 2, stat / 2))
