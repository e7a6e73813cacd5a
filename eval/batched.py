"""Batched speculative decoding: B sequences share one target forward per step, each accepting its own count.

The batch-size-B sibling of `eval/decoder.py` (same proposers, same acceptance rules, same timer),
run by `eval/bench.py`. No sequence is ever compacted on its own; instead the batch keeps

    cache   one DynamicCache, keys/values [B, kv_heads, L, D]. Slot j of row b holds a real token of
            sequence b iff valid[b, j]; left padding, rejected draft nodes and the dummy inputs of
            short drafts and finished rows are holes that every later query masks out.
    valid   [B, L] bool (on the target's device)
    npos    [B] valid tokens of each sequence = the RoPE position of its root (last emitted token)

One step (W = 1 + the longest draft of the step):

    draft   every live sequence's own proposer drafts n_b nodes (a chain, or any tree); finished
            rows draft nothing and stay in the batch as one masked dummy slot
    forward ids [B, W] = root + draft + padding, positions npos + depth [B, W],
            mask [B, 1, W, L+W] = the row's valid slots + its own tree (every slot sees itself)
    verify  verify_greedy / verify_sampling per sequence on logits[b, :n_b+1], exactly as decoder.py
    keep    the root and the accepted nodes become valid; the other new slots stay holes. The kept
            entries sit at their true positions already (RoPE was applied with npos + depth)
    repack  when holes waste more than a quarter of L, each row's valid slots are gathered to the
            right end (a left-padded cache again), so attention stops paying for rejected drafts

With no drafts the step is plain batched decoding: the baseline is this loop with null proposers.
Batch size 1 gives what `SpeculativeDecoder` gives (same random draws in the same order).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from draftsmith.distill.target import Target
from draftsmith.eval.decoder import GenerationResult, timed
from draftsmith.eval.kv_cache import check_cache_layers, repack_cache
from draftsmith.eval.proposers import EMPTY_DRAFT, Proposer
from draftsmith.eval.tree import TreeBuffers, build_tree_buffers
from draftsmith.eval.verify import SamplingConfig, Verdict, logits_to_probs, verify_greedy, verify_sampling

ProposerSource = Proposer | list[Proposer] | Callable[[], Proposer] | None


@dataclass
class BatchResult:
    results: list[GenerationResult]  # one per sequence, in prompt order
    wall_time: float  # seconds for the whole batch, prefill included
    steps: int  # target forwards after prefill

    @property
    def new_tokens(self) -> int:
        return sum(r.new_tokens for r in self.results)

    @property
    def tau(self) -> float:
        """Tokens per (sequence, verification forward) while the sequence was live; plain decoding = 1.0."""
        lengths = [a for r in self.results for a in r.accept_lengths]
        return sum(lengths) / len(lengths) if lengths else 1.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_time if self.wall_time > 0 else 0.0


@functools.lru_cache(maxsize=4096)
def tree_buffers(parents: tuple[int, ...]) -> TreeBuffers:
    """CPU buffers of a draft shape, memoised (chains of each length repeat every step). Verification only
    walks their lists, and the step inputs are assembled on the CPU, so nothing here syncs a GPU."""
    return build_tree_buffers(list(parents))


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool `allowed [B, q, k]` -> the additive `[B, 1, q, k]` mask HF attention takes (0 or dtype-min)."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)  # [B, q, k]
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min).unsqueeze(1)


class BatchedSpeculativeDecoder:
    """Speculative decoding of a batch of prompts with `target`; `proposers` drafts for each sequence.

    `proposers`: None (plain batched decoding), one Proposer (shallow-copied per sequence: proposers
    keep their per-sequence state in what `begin` sets), a list (one per sequence) or a factory.
    """

    def __init__(self, target: Target, proposers: ProposerSource = None, repack_fraction: float = 0.25):
        self.target = target
        self.source = proposers
        self.eos = set(target.eos_token_ids)
        self.pad_id = 0  # any id in the vocabulary: padding and dummy slots are masked out
        self.repack_fraction = repack_fraction

    def proposers(self, batch: int) -> list[Proposer]:
        source = self.source
        if source is None:
            return [Proposer() for _ in range(batch)]
        if isinstance(source, Proposer):
            return [copy.copy(source) for _ in range(batch)]
        if isinstance(source, list):
            if len(source) < batch:
                raise ValueError(f"{len(source)} proposers for a batch of {batch}: pass one per sequence or a factory")
            return source[:batch]
        return [source() for _ in range(batch)]

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], max_new_tokens: int, sampling: SamplingConfig | None = None,
                 generator: torch.Generator | None = None) -> BatchResult:
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("batched generate needs at least one prompt and no empty prompt")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        sampling = sampling or SamplingConfig()
        (results, steps), seconds = timed(lambda: self._generate([list(p) for p in prompts], max_new_tokens,
                                                                 sampling, generator), self.target.device)
        for r in results:
            r.wall_time = seconds
        return BatchResult(results, seconds, steps)

    def _prefill(self, prompts: list[list[int]], cache: DynamicCache, layers, sampling, generator):
        """Left-padded prompts in one forward -> (first tokens, valid [B, P], per-sequence prompt features)."""
        device, B, P = self.target.device, len(prompts), max(len(p) for p in prompts)
        ids = torch.full((B, P), self.pad_id, dtype=torch.long)
        valid = torch.zeros(B, P, dtype=torch.bool)
        for b, p in enumerate(prompts):
            ids[b, P - len(p):] = torch.tensor(p)
            valid[b, P - len(p):] = True
        pos = (valid.long().cumsum(1) - 1).clamp_min(0)  # [B, P]
        allowed = torch.ones(P, P, dtype=torch.bool).tril() & valid[:, None, :] | torch.eye(P, dtype=torch.bool)
        out = self.target.forward(ids.to(device), attention_mask=additive_mask(allowed.to(device), self.target.dtype),
                                  position_ids=pos.to(device), cache=cache, use_cache=True, layers=layers,
                                  logits_to_keep=1)
        check_cache_layers(cache)
        last = out.logits[:, -1]  # [B, V]: left padding puts every prompt's last token in the last column
        if sampling.greedy:
            first = last.argmax(-1).tolist()
        else:
            first = [int(torch.multinomial(logits_to_probs(last[b], sampling), 1, generator=generator)) for b in range(B)]
        features = [{k: h[b, P - len(p):] for k, h in out.hidden.items()} for b, p in enumerate(prompts)]  # [T_b, H]
        return first, valid.to(device), features

    def _step_inputs(self, roots, drafts, bufs, npos):
        """ids, positions [B, W] and own-tree visibility [B, W, W] of one verification forward."""
        B, W = len(drafts), 1 + max(d.n for d in drafts)
        ids = torch.full((B, W), self.pad_id, dtype=torch.long)
        pos = torch.tensor(npos).unsqueeze(1).repeat(1, W)  # [B, W]; padding slots just need a finite position
        own = torch.eye(W, dtype=torch.bool).repeat(B, 1, 1)  # [B, W, W]
        for b, (draft, buf) in enumerate(zip(drafts, bufs)):
            if roots[b] is None:
                continue
            n = draft.n
            ids[b, : n + 1] = torch.tensor([roots[b], *draft.tokens])
            pos[b, : n + 1] += buf.depth
            own[b, : n + 1, : n + 1] = buf.visible
        return ids, pos, own

    def _generate(self, prompts: list[list[int]], max_new: int, sampling: SamplingConfig, generator):
        target, device, B = self.target, self.target.device, len(prompts)
        proposers = self.proposers(B)
        layers = tuple(dict.fromkeys(k for p in proposers for k in p.feature_layers))
        cache = DynamicCache(config=target.config)
        first, valid, features = self._prefill(prompts, cache, layers, sampling, generator)
        results = [GenerationResult(output_ids=[tok]) for tok in first]
        contexts = [p + [tok] for p, tok in zip(prompts, first)]
        npos = [len(p) for p in prompts]
        for proposer, prompt, feats in zip(proposers, prompts, features):
            proposer.begin(prompt, feats)
        live = [tok not in self.eos and max_new > 1 for tok in first]
        steps = 0
        while any(live):
            drafts = [p.propose(c, sampling, generator) if on else EMPTY_DRAFT
                      for p, c, on in zip(proposers, contexts, live)]
            bufs = [tree_buffers(tuple(d.parents)) for d in drafts]
            roots = [c[-1] if on else None for c, on in zip(contexts, live)]
            ids, pos, own = self._step_inputs(roots, drafts, bufs, npos)
            W, L = ids.shape[1], valid.shape[1]
            allowed = torch.cat([valid[:, None, :].expand(B, W, L), own.to(device)], -1)  # [B, W, L+W]
            out = target.forward(ids.to(device), attention_mask=additive_mask(allowed, target.dtype),
                                 position_ids=pos.to(device), cache=cache, use_cache=True, layers=layers)
            steps += 1
            kept = torch.zeros(B, W, dtype=torch.bool)
            # greedy rows without a draft (plain decoding) read one batched argmax: one sync, not B
            plain = out.logits[:, 0].argmax(-1).tolist() if sampling.greedy and any(d.n == 0 for d in drafts) else None
            for b in (b for b in range(B) if live[b]):
                draft, buf, rows = drafts[b], bufs[b], out.logits[b, : drafts[b].n + 1]  # rows [n+1, V]
                if plain is not None and draft.n == 0:
                    verdict = Verdict([], plain[b], [plain[b]])
                elif sampling.greedy:
                    verdict = verify_greedy(draft.tokens, buf, rows)
                else:
                    verdict = verify_sampling(draft.tokens, buf, logits_to_probs(rows, sampling), draft.probs, generator)
                keep = [0, *verdict.accepted]  # tree indices = slots of this step: root + accepted path
                kept[b, keep] = True
                npos[b] += len(keep)
                new = results[b].record(verdict.tokens, buf.max_depth, len(verdict.accepted), self.eos, max_new)
                contexts[b] += new
                live[b] = new[-1] not in self.eos and results[b].new_tokens < max_new
                if live[b]:
                    index = torch.tensor(keep, device=device)
                    proposers[b].commit(new, {k: h[b].index_select(0, index) for k, h in out.hidden.items()})
            valid = torch.cat([valid, kept.to(device)], 1)  # [B, L+W]
            if valid.shape[1] - max(npos) > max(16, self.repack_fraction * valid.shape[1]):  # npos = valid count
                valid = repack_cache(cache, valid)
        return results, steps
