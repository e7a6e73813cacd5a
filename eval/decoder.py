"""The tree-verification decoder: lossless speculative generation on the target's own forward.

Every τ and speedup draftsmith reports comes from `SpeculativeDecoder.generate`. One step:

    draft  = proposer.propose(context)              # n tokens in a tree (parents), maybe their q
    logits = target([root] + draft, 4-D tree mask, position ids = prefix + depth, its DynamicCache)
    verdict = verify_greedy | verify_sampling       # accepted path + the target's bonus token
    compact the cache to prefix + root + accepted path; proposer.commit(accepted + bonus)

The root is the last emitted token, not yet in the cache, so the bonus token costs no extra
forward. Chains skip the custom mask (plain causal attention is the same thing). With an empty
draft the step is plain decoding: the autoregressive baseline is this same loop with the null
proposer, so both sides of every speedup share the engine and the timing code.

Shapes: context ids [1, T]; verification input [1, n+1]; logits [n+1, V]; mask [1, 1, n+1, P+n+1].
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from draftsmith.distill.target import Target
from draftsmith.eval import kv_cache
from draftsmith.eval.proposers import Proposer
from draftsmith.eval.tree import TreeBuffers, build_tree_buffers, position_ids, verification_mask
from draftsmith.eval.verify import SamplingConfig, logits_to_probs, verify_greedy, verify_sampling


@dataclass
class GenerationResult:
    output_ids: list[int]  # new tokens only (EOS included when it ended the answer)
    accept_lengths: list[int] = field(default_factory=list)  # tokens emitted per verification forward
    draft_depths: list[int] = field(default_factory=list)  # depth of each step's draft (0 = none)
    accepted_drafts: list[int] = field(default_factory=list)  # draft tokens accepted per step (before EOS/length cut)
    wall_time: float = 0.0  # seconds, prefill included

    @property
    def new_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def tau(self) -> float:
        """Mean tokens per target forward after prefill, bonus counted (plain decoding = 1.0)."""
        return sum(self.accept_lengths) / len(self.accept_lengths) if self.accept_lengths else 1.0

    def record(self, tokens: list[int], depth: int, accepted: int, eos: set[int], max_new: int) -> list[int]:
        """Append one verification step's tokens, cut after EOS and at `max_new` exactly where plain
        decoding stops; returns the tokens kept."""
        room = tokens[: max_new - self.new_tokens]
        end = next((j + 1 for j, tok in enumerate(room) if tok in eos), len(room))
        self.output_ids += room[:end]
        self.accept_lengths.append(end)
        self.draft_depths.append(depth)
        self.accepted_drafts.append(accepted)
        return room[:end]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device):
    """(result, seconds) — the one timer used for every method compared in a benchmark."""
    sync(device)
    start = time.perf_counter()
    result = fn()
    sync(device)
    return result, time.perf_counter() - start


class SpeculativeDecoder:
    """Batch-size-1 speculative decoding of `target` with `proposer` (None = autoregressive)."""

    def __init__(self, target: Target, proposer: Proposer | None = None):
        self.target = target
        self.proposer = proposer or Proposer()
        self.eos = set(target.eos_token_ids)
        self._buffers: dict[tuple[int, ...], tuple[TreeBuffers, bool]] = {}

    def buffers(self, parents: list[int]) -> tuple[TreeBuffers, bool]:
        """Tree buffers (and whether the tree is a chain), memoised: static trees repeat every step."""
        key = tuple(parents)
        if key not in self._buffers:
            if len(self._buffers) > 4096:
                self._buffers.clear()
            is_chain = all(p == i - 1 for i, p in enumerate(parents))
            self._buffers[key] = (build_tree_buffers(list(parents)).to(self.target.device), is_chain)
        return self._buffers[key]

    def _first_token(self, logits: torch.Tensor, sampling: SamplingConfig, generator) -> int:
        if sampling.greedy:
            return int(logits.argmax())
        return int(torch.multinomial(logits_to_probs(logits, sampling), 1, generator=generator))

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingConfig | None = None,
                 generator: torch.Generator | None = None) -> GenerationResult:
        result, seconds = timed(lambda: self._generate(list(prompt_ids), max_new_tokens,
                                                       sampling or SamplingConfig(), generator), self.target.device)
        result.wall_time = seconds
        return result

    def _generate(self, prompt: list[int], max_new_tokens: int, sampling: SamplingConfig, generator) -> GenerationResult:
        target, proposer, device = self.target, self.proposer, self.target.device
        layers = proposer.feature_layers
        cache = DynamicCache(config=target.config)
        out = target.forward(torch.tensor([prompt], device=device), cache=cache, use_cache=True,
                             layers=layers, logits_to_keep=1)
        root = self._first_token(out.logits[0, -1], sampling, generator)
        proposer.begin(prompt, {k: h[0] for k, h in out.hidden.items()})
        context, result = prompt + [root], GenerationResult(output_ids=[root])
        prefix = len(prompt)  # positions in the target's cache; the root is not among them yet
        while root not in self.eos and result.new_tokens < max_new_tokens:
            draft = proposer.propose(context, sampling, generator)
            bufs, is_chain = self.buffers(draft.parents)
            ids = torch.tensor([[root, *draft.tokens]], device=device)  # [1, n+1]
            mask = pos = None
            if not is_chain:
                mask = verification_mask(bufs.visible, prefix, target.dtype)  # [1, 1, n+1, P+n+1]
                pos = position_ids(bufs.depth, prefix)  # [1, n+1]
            out = target.forward(ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True,
                                 layers=layers)
            logits = out.logits[0]  # [n+1, V]
            if sampling.greedy:
                verdict = verify_greedy(draft.tokens, bufs, logits)
            else:
                verdict = verify_sampling(draft.tokens, bufs, logits_to_probs(logits, sampling), draft.probs, generator)
            keep = [0, *verdict.accepted]  # tree indices: root + accepted path
            kv_cache.compact_cache(cache, prefix, keep)
            prefix += len(keep)
            new = result.record(verdict.tokens, bufs.max_depth, len(verdict.accepted), self.eos, max_new_tokens)
            context += new
            root = new[-1]
            if root not in self.eos and result.new_tokens < max_new_tokens:
                features = {}
                if out.hidden:
                    index = torch.tensor(keep, device=device)
                    features = {k: h[0].index_select(0, index) for k, h in out.hidden.items()}
                proposer.commit(new, features)
        return result


def hf_generate(target: Target, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingConfig | None = None,
                assistant_model: torch.nn.Module | None = None, **kwargs) -> tuple[list[int], float]:
    """HF `generate` on the same prompt and timer: (new token ids, seconds). The peer every table cites."""
    sampling = sampling or SamplingConfig()
    ids = torch.tensor([prompt_ids], device=target.device)
    args = dict(max_new_tokens=max_new_tokens, eos_token_id=target.eos_token_ids,
                pad_token_id=target.eos_token_ids[0], attention_mask=torch.ones_like(ids))
    if sampling.greedy:
        args.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    else:
        args.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k or None)
    if assistant_model is not None:
        args["assistant_model"] = assistant_model
    args.update(kwargs)
    with torch.inference_mode():
        out, seconds = timed(lambda: target.model.generate(ids, **args), target.device)
    return out[0, len(prompt_ids):].tolist(), seconds
