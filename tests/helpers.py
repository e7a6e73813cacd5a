"""Offline builders for tests: a byte-level ChatML tokenizer and tiny random HF causal LMs on disk.

Nothing here downloads. `build_tiny_tokenizer()` is a 259-token byte-level BPE (3 specials + 256
bytes, no merges) wrapped in `PreTrainedTokenizerFast` with SmolLM2's ChatML template, so any text
round-trips. `build_tiny_model_dir(...)` saves a tiny Llama or Qwen2 (hidden 32, vocab 259) plus
that tokenizer to a folder that `draftsmith.distill.target.load_target(str(folder))` loads exactly
like a real target folder; `<|im_end|>` is eos and pad. Shared by several test files: stub
proposers that know the target's greedy stream (`OracleProposer`), random prompts, every
training-free and untrained proposer (`proposers_for`), untrained EAGLE drafters (`randomised`) and
the features a drafter reads computed the way `Target.forward` keys them (`features_of`), the
root-to-leaf paths of a tree (`leaf_paths`).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch

from draftsmith.distill.target import Target
from draftsmith.eval.serving import build_proposer
from draftsmith.heads.medusa.model import MedusaHeads
from draftsmith.heads.registry import DrafterConfig, build_drafter
from draftsmith.heads.runtime.proposer import Draft, Proposer
from draftsmith.heads.runtime.tree import chain_parents

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
IM_START, IM_END = 1, 2

# SmolLM2-135M-Instruct's ChatML template (adds a default system turn when none is given).
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' "
    "}}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% "
    "endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# A reasoning template in the manner of Qwen3's (the chat_template of Qwen/Qwen3-*): an assistant turn after
# the last user turn shows its thinking (`reasoning_content`, or the text before `</think>` in its
# content), an earlier one only its answer; `enable_thinking=false` pre-fills an empty think block.
THINKING_TEMPLATE = (
    "{%- set ns = namespace(last=-1) -%}{%- for m in messages -%}{%- if m['role'] == 'user' -%}"
    "{%- set ns.last = loop.index0 -%}{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}{%- if m['role'] == 'assistant' -%}"
    "{%- set content = m['content'] -%}{%- set thinking = m.get('reasoning_content') or '' -%}"
    "{%- if '</think>' in content -%}{%- set thinking = content.split('</think>')[0].split('<think>')[-1]"
    ".strip() -%}{%- set content = content.split('</think>')[-1].lstrip() -%}{%- endif -%}"
    "{{- '<|im_start|>assistant\n' -}}{%- if loop.index0 > ns.last -%}"
    "{{- '<think>\n' + thinking + '\n</think>\n\n' -}}{%- endif -%}{{- content + '<|im_end|>\n' -}}"
    "{%- else -%}{{- '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' -}}{%- endif -%}"
    "{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\n\n</think>\n\n' -}}"
    "{%- endif -%}{%- endif -%}"
)

# A template in the manner of gpt-oss's harmony one (its rules as llama.cpp b11434 models/templates/
# openai-gpt-oss-120b.jinja renders them, written small): messages `<|start|>ROLE<|message|>...<|end|>`;
# the last assistant turn of a finished chat shows its `thinking` as the analysis channel and ends its final
# message in `<|return|>` (the eos), an earlier one only `<|channel|>final` ending in `<|end|>`; channel
# tags inside a field are refused; the generation prompt is `<|start|>assistant`.
HARMONY_TOKENS = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>"]
HARMONY_TEMPLATE = (
    "{%- for m in messages -%}{%- if '<|channel|>' in m['content'] -%}"
    "{{- raise_exception('channel tags in content: pass analysis as thinking') -}}{%- endif -%}"
    "{%- if m['role'] == 'assistant' -%}"
    "{%- if loop.last and not add_generation_prompt -%}{%- if 'thinking' in m -%}"
    "{{- '<|start|>assistant<|channel|>analysis<|message|>' + m['thinking'] + '<|end|>' -}}{%- endif -%}"
    "{{- '<|start|>assistant<|channel|>final<|message|>' + m['content'] + '<|return|>' -}}"
    "{%- else -%}{{- '<|start|>assistant<|channel|>final<|message|>' + m['content'] + '<|end|>' -}}"
    "{%- endif -%}"
    "{%- else -%}{{- '<|start|>' + m['role'] + '<|message|>' + m['content'] + '<|end|>' -}}{%- endif -%}"
    "{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|start|>assistant' -}}{%- endif -%}"
)


def build_harmony_tokenizer():
    """The byte tokenizer with harmony's tags as special tokens, `<|return|>` as eos and HARMONY_TEMPLATE."""
    tokenizer = build_tiny_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": HARMONY_TOKENS, "eos_token": "<|return|>"})
    tokenizer.chat_template = HARMONY_TEMPLATE
    return tokenizer


TINY_SIZES = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2)


def load_script(name: str):
    """A file of scripts/ as a module (they are scripts, not package code): "CAMPAIGN/MODULE" for a campaign
    folder of scripts/bench/ (load_script("levers/page")), or a name found once among scripts/,
    scripts/bench/, its campaign folders and scripts/dev/ (load_script("curve_table"))."""
    scripts = Path(__file__).resolve().parents[1] / "scripts"
    if "/" in name:
        found = [scripts / "bench" / f"{name}.py"]
    else:
        found = [p for p in (scripts / f"{name}.py", scripts / "bench" / f"{name}.py",
                             *sorted((scripts / "bench").glob(f"*/{name}.py")),
                             scripts / "dev" / f"{name}.py")
                 if p.is_file()]
        assert len(found) == 1, (f"load_script({name!r}): {len(found)} files of that name; name it as "
                                 f"CAMPAIGN/{name}")
    path = found[0]
    spec = importlib.util.spec_from_file_location(name.replace("/", "_"), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    """A tiny random Llama / Qwen2 / Qwen3 / Gemma 3 causal LM in fp32 (eos/pad = `<|im_end|>`)."""
    from transformers import (
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    families = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM),
                "qwen3": (Qwen3Config, Qwen3ForCausalLM), "gemma3": (Gemma3TextConfig, Gemma3ForCausalLM)}
    if family not in families:
        raise ValueError(f"family '{family}' unknown; use one of {', '.join(families)}")
    config_cls, model_cls = families[family]
    # initializer_range 0.2 (not 0.02) makes next-token logits peaked, so greedy argmax is far from
    # ties and batched vs unbatched comparisons are not at the mercy of float rounding.
    extra = {"head_dim": 8} if family in ("qwen3", "gemma3") else {}
    if family == "gemma3":  # a sliding-window layer every other layer, as Gemma 3 has (window 8 here)
        extra.update(sliding_window=8, layer_types=["sliding_attention", "full_attention"] * (layers // 2)
                     + ["sliding_attention"] * (layers % 2))
    config = config_cls(**TINY_SIZES, num_hidden_layers=layers, vocab_size=vocab_size, initializer_range=0.2,
                        bos_token_id=IM_START, eos_token_id=IM_END, pad_token_id=IM_END,
                        max_position_embeddings=1024, **extra)
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    model.generation_config.eos_token_id = IM_END
    model.generation_config.pad_token_id = IM_END
    model.generation_config.bos_token_id = IM_START
    return model


def build_tiny_model_dir(tmp_path, family: str = "llama", layers: int = 2, seed: int = 0) -> Path:
    """Save a tiny model + the tiny tokenizer under `tmp_path/<family>-L<layers>-s<seed>`; returns the
    folder."""
    folder = Path(tmp_path) / f"tiny-{family}-L{layers}-s{seed}"
    if (folder / "config.json").is_file():
        return folder
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(family, layers, seed, vocab_size=len(tokenizer))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def write_pattern_conversations(path: Path, n: int) -> Path:
    """`n` short conversations whose answers follow a fixed, learnable pattern (for tiny training runs)."""
    with open(path, "w") as fh:
        for i in range(n):
            answer = " ".join(["abc def"] * (3 + i % 4)) + f" {i % 7}"
            fh.write(json.dumps({"id": f"c{i}", "conversation": [
                {"role": "user", "content": f"question {i}: repeat the pattern"},
                {"role": "assistant", "content": answer}]}) + "\n")
    return path


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square p-value of observed `counts` against cell probabilities (sparse cells pooled; an
    outcome of probability 0 observed gives 0, as top-k / top-p laws have such cells)."""
    expected = probs.double().flatten() * counts.sum()
    observed = counts.double().flatten()
    impossible = expected == 0
    if observed[impossible].sum() > 0:
        return 0.0
    expected, observed = expected[~impossible], observed[~impossible]
    small = expected < 5
    if small.any():
        expected = torch.cat([expected[~small], expected[small].sum().reshape(1)])
        observed = torch.cat([observed[~small], observed[small].sum().reshape(1)])
    stat = ((observed - expected) ** 2 / expected).sum()
    df = torch.tensor(len(expected) - 1, dtype=torch.float64)
    return float(torch.special.gammaincc(df / 2, stat / 2))


class OracleProposer(Proposer):
    """Knows the target's greedy continuation; drafts it with `wrong_from` tokens spoiled."""

    name = "oracle"

    def __init__(self, reference: list[int], prompt_len: int, k: int, wrong_from: int | None = None,
                 vocab: int = 259):
        self.reference, self.prompt_len, self.k = reference, prompt_len, k
        self.wrong_from, self.vocab = wrong_from, vocab

    def propose(self, context, sampling, generator) -> Draft:
        done = len(context) - self.prompt_len  # tokens emitted so far
        tokens = list(self.reference[done: done + self.k])
        if self.wrong_from is not None:
            tokens = tokens[: self.wrong_from] + [(t + 1) % self.vocab for t in tokens[self.wrong_from:]]
        return Draft(tokens=tokens, parents=chain_parents(len(tokens)))


def prompts(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 259, (int(torch.randint(4, 40, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def proposers_for(target: Target, tmp_path_factory) -> dict[str, Proposer]:
    """Every training-free and untrained proposer, chains and trees."""
    draft_dir = build_tiny_model_dir(tmp_path_factory.mktemp("draft"), "llama", layers=1, seed=7)
    medusa_dir = tmp_path_factory.mktemp("medusa")
    heads = MedusaHeads(target.config.hidden_size, target.vocab_size, num_heads=4)
    heads.init_from_target(target.model.get_output_embeddings().weight)
    torch.manual_seed(0)
    for block in heads.modules():  # untrained but not the identity: random residual blocks
        if isinstance(block, torch.nn.Linear) and block.out_features == target.config.hidden_size:
            torch.nn.init.normal_(block.weight, std=0.5)
    heads.save_pretrained(medusa_dir, target=target.name)
    return {
        "medusa-untrained-tree": build_proposer(DrafterConfig(kind="medusa", path=str(medusa_dir)), target),
        "medusa-untrained-chain": build_proposer(DrafterConfig(kind="medusa", path=str(medusa_dir),
                                                               tree="chain-3"), target),
        "prompt-lookup": build_proposer(DrafterConfig.for_kind("prompt-lookup", num_speculative_tokens=4,
                                                               ngram_min=1), target),
        "layer-skip-chain": build_proposer(DrafterConfig.for_kind("layer-skip", layers=1,
                                                                  num_speculative_tokens=3), target),
        "layer-skip-topk": build_proposer(DrafterConfig.for_kind("layer-skip", layers=2, top_k=3), target),
        "layer-skip-medusa-tree": build_proposer(
            DrafterConfig.for_kind("layer-skip", layers=1, tree="medusa-k4-default"), target),
        "draft-lm-chain": build_proposer(DrafterConfig(kind="draft-lm", path=str(draft_dir),
                                                       num_speculative_tokens=5), target),
        "draft-lm-tree": build_proposer(DrafterConfig(kind="draft-lm", path=str(draft_dir), top_k=2,
                                                      num_speculative_tokens=3), target),
    }


def features_of(target_model, drafter, ids):
    """The batch features a drafter reads, computed the way Target.forward keys them."""
    out = target_model(ids, output_hidden_states=True)
    hs = out.hidden_states  # [N+1] x [B, T, H]; hs[i+1] = output of layer i (the last one normed)
    feats = {k: hs[-1] if k == "final" else hs[k + 1] for k in drafter.feature_layers}
    return feats, out.logits


def randomised(kind, target, vocab=0):
    """An untrained drafter whose layer is not near-zero: drafts are arbitrary but deterministic."""
    own = dict(draft_vocab=vocab, aux_layers=[1, 2, 3]) if kind == "eagle3" else {}
    cfg = DrafterConfig.for_kind(kind, **own)
    torch.manual_seed(1)
    return build_drafter(cfg, target.model, torch.arange(target.vocab_size))


def leaf_paths(parents: list[int]) -> list[list[int]]:
    """Root-to-leaf paths of a tree in tree indices (0 = root, node i = i + 1), leaves in node order."""
    up = [-1] + [p + 1 for p in parents]
    children = {j: [c for c in range(1, len(up)) if up[c] == j] for j in range(len(up))}
    paths = []
    for leaf in (j for j in range(len(up)) if not children[j]):
        path = [leaf]
        while up[path[-1]] >= 0:
            path.append(up[path[-1]])
        paths.append(path[::-1])
    return paths


def assert_follows_expected_length(grads) -> None:
    """`grads(weights) -> (the loss's gradient, -grad(expected accepted length) / sum W)` for weights
    "acceptance" and "decay": the acceptance-weighted tvd loss follows the expected accepted length exactly;
    its twin, the fixed decay, does not (cosine below 0.99)."""
    import torch

    ours, aligned = grads("acceptance")
    assert torch.allclose(ours, aligned, atol=1e-6, rtol=1e-4)
    decayed, aligned = grads("decay")
    assert torch.nn.functional.cosine_similarity(decayed.flatten(), aligned.flatten(), dim=0) < 0.99


def two_at_once(fn, *args) -> list:
    """`fn(*args)` in two threads at once (each its own lock handle, as two ranks or two runs) -> both
    answers, an exception raised in a thread as its answer (the test names what it expects)."""
    import threading

    answers = []

    def run():
        try:
            answers.append(fn(*args))
        except Exception as exc:  # noqa: BLE001 (returned to the test)
            answers.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers
