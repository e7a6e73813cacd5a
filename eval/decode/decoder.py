"""The tree-verification decoder: lossless speculative generation on the target's own forward, for one
sequence or a batch, in one loop.

Every τ and speedup draftsmith reports comes from `SpeculativeDecoder` (eval at batch 1, bench at
batch 1 and up). One step, for every live sequence b of the batch:

    draft_b = proposer_b.propose(context_b)           # n_b tokens in a tree (parents), maybe their q
    logits  = target(ids [B, W] = root + draft + padding, positions npos + depth, mask, one cache)
    verdict_b = verify_greedy | verify_sampling       # sequence b's accepted path + the target's bonus token
    keep root + accepted path; proposer_b.commit(accepted + bonus)

The root is the last emitted token, not yet in the cache, so the bonus token costs no extra forward.
The cache (one DynamicCache, keys/values [B, kv_heads, L, D]) is kept two ways:

    one sequence  compacted every step to prefix + root + accepted path, so it never holds a hole:
                  a chain then needs no mask at all (plain causal attention is the same thing) and a
                  tree the 4-D tree mask over [cached | tree] (`verification_mask`)
    a batch       no row is compacted on its own; `valid [B, L]` says which slots hold real tokens of
                  that row. Left padding, rejected draft nodes and the dummy inputs of short drafts and
                  finished rows are holes every later query masks out; the kept entries already sit at
                  their true positions (RoPE was applied with npos + depth). When holes waste more than
                  `repack_fraction` of L, each row's valid slots are gathered to the right end
                  (`kv_cache.repack_cache`), a left-padded cache again

With no drafts the step is plain decoding: the baseline is this same loop with null proposers, so
both sides of every speedup share the engine and the timing code. Batch 1 draws the same random
numbers in the same order whatever the batch path.

Shapes: context ids [T]; verification input [B, W]; logits [B, W, V]; mask [B, 1, W, L+W].
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Callable
from contextlib import nullcontext

import torch

from draftsmith.distill.target import Target, TargetOutput, left_pad
from draftsmith.eval.decode.results import BatchResult, GenerationResult, sync, timed
from draftsmith.heads.runtime.kv_cache import (
    check_cache_layers,
    compact_cache,
    crop_cache,
    expand,
    keep_row,
    new_cache,
    recurrent,
    repack_cache,
    sliding_window,
)
from draftsmith.heads.runtime.proposer import EMPTY_DRAFT, Proposer
from draftsmith.heads.runtime.short_scan import recorded
from draftsmith.heads.runtime.tree import TreeBuffers, build_tree_buffers, chain_parents, tree_mask
from draftsmith.heads.runtime.verify import (
    SamplingConfig,
    Verdict,
    logits_to_probs,
    verify_greedy,
    verify_sampling,
)

ProposerSource = Proposer | list[Proposer] | Callable[[], Proposer] | None


@functools.lru_cache(maxsize=4096)
def tree_buffers(parents: tuple[int, ...]) -> tuple[TreeBuffers, bool]:
    """CPU buffers of a draft shape and whether it is a chain, memoised (chains of each length repeat every
    step). Verification only walks their lists and step inputs are assembled on the CPU: no GPU sync here."""
    return build_tree_buffers(list(parents)), list(parents) == chain_parents(len(parents))


def one_at_a_time(model) -> str | None:
    """Why `model` is decoded one sequence at a time (the batch path's masked holes would count as tokens in a
    sliding window or a recurrent state), or None: the sentence eval, bench and plan refuse a batch with."""
    config = model.config
    what = ("recurrent (linear-attention, state-space or convolution)" if recurrent(config) else
            "sliding-window" if sliding_window(config) else None)
    if what is None:
        return None
    name = type(model).__name__
    return f"{name} has {what} layers: speculative decoding runs it one sequence at a time; use batch size 1"


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool `allowed [B, q, k]` -> the additive `[B, 1, q, k]` mask HF attention takes (0 or dtype-min)."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)  # [B, q, k]
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min).unsqueeze(1)


class SpeculativeDecoder:
    """Speculative decoding with `target`; `proposers` drafts for each sequence (see the module doc).

    `proposers`: None (plain decoding: the baseline), one Proposer (used as is for one sequence and
    shallow-copied per sequence of a batch: proposers keep their per-sequence state in what `begin`
    sets), a list (one per sequence) or a factory.
    """

    def __init__(self, target: Target, proposers: ProposerSource = None, repack_fraction: float = 0.25,
                 compact: bool = True):
        self.target = target
        self.source = proposers
        self.eos = set(target.eos_token_ids)
        self.pad_id = 0  # any id in the vocabulary: padding and dummy slots are masked out
        self.repack_fraction = repack_fraction
        self.compact = compact  # one sequence: compact its cache every step (False: holes, as a batch does)

    @property
    def proposer(self) -> Proposer:
        """The proposer one sequence is decoded with."""
        return self.proposers(1)[0]

    def proposers(self, batch: int) -> list[Proposer]:
        source = self.source
        if source is None:
            return [Proposer() for _ in range(batch)]
        if isinstance(source, Proposer):
            return [source] if batch == 1 else [copy.copy(source) for _ in range(batch)]
        if isinstance(source, list):
            if len(source) < batch:
                raise ValueError(f"{len(source)} proposers for a batch of {batch}: pass one per sequence or "
                                 "a factory")
            return source[:batch]
        return [source() for _ in range(batch)]

    def generate(self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingConfig | None = None,
                 generator: torch.Generator | None = None) -> GenerationResult:
        """One sequence (timed: `wall_time`, and where its steps' time went: `phase_seconds`)."""
        out = self.generate_batch([prompt_ids], max_new_tokens, sampling, generator)
        out.results[0].phase_seconds = out.phase_seconds
        return out.results[0]

    @torch.inference_mode()
    def generate_batch(self, prompts: list[list[int]], max_new_tokens: int,
                       sampling: SamplingConfig | None = None,
                       generator: torch.Generator | None = None) -> BatchResult:
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("generate needs at least one prompt and no empty prompt")
        refused = one_at_a_time(self.target.model)
        if refused and (len(prompts) > 1 or not self.compact):
            raise ValueError(refused)
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        sampling = sampling or SamplingConfig()
        (results, steps, phases), seconds = timed(
            lambda: self._generate([list(p) for p in prompts], max_new_tokens, sampling, generator),
            self.target.device)
        for r in results:
            r.wall_time = seconds
        return BatchResult(results, seconds, steps, {k: round(v, 6) for k, v in phases.items()})

    def _first_tokens(self, last: torch.Tensor, sampling: SamplingConfig, generator) -> list[int]:
        """last logits `[B, V]` -> the first new token of each sequence."""
        if sampling.greedy:
            return last.argmax(-1).tolist()
        return [int(torch.multinomial(logits_to_probs(row, sampling), 1,
                                      generator=generator)) for row in last]

    def _prefill(self, prompts: list[list[int]], cache, layers, sampling, generator):
        """Left-padded prompts in one forward -> (first tokens, valid [B, P] or None for one sequence,
        features)."""
        device, B = self.target.device, len(prompts)
        ids, attn = left_pad(prompts, self.pad_id)
        if B == 1 and self.compact:  # no padding: the model's own causal mask and positions
            out = self.target.forward(ids.to(device), cache=cache, use_cache=True, layers=layers,
                                      logits_to_keep=1)
            if any(h.shape[1] < ids.shape[1] for h in out.hidden.values()):
                # layers that computed only the kept position (Gemma-4's KV-sharing layers skip the others):
                # the features need every position, so once more, keeping every position's logits
                crop_cache(cache, 0)
                out = self.target.forward(ids.to(device), cache=cache, use_cache=True, layers=layers)
            valid = None
        else:
            valid, P = attn.bool(), ids.shape[1]
            pos = (valid.long().cumsum(1) - 1).clamp_min(0)  # [B, P]
            allowed = torch.ones(P, P,
                                 dtype=torch.bool).tril() & valid[:, None, :] | torch.eye(P, dtype=torch.bool)
            out = self.target.forward(ids.to(device),
                                      attention_mask=additive_mask(allowed.to(device), self.target.dtype),
                                      position_ids=pos.to(device), cache=cache, use_cache=True, layers=layers,
                                      logits_to_keep=1)
            check_cache_layers(cache)
            valid = valid.to(device)
        # left padding: every last token is last
        first = self._first_tokens(out.logits[:, -1], sampling, generator)
        P = ids.shape[1]
        # [T_b, H]
        features = [{k: h[b, P - len(p):] for k, h in out.hidden.items()} for b, p in enumerate(prompts)]
        return first, valid, features

    def _step_inputs(self, roots, drafts, bufs, npos, valid):
        """ids, positions `[B, W]` and the additive mask of one verification forward (None where causal)."""
        dtype, device = self.target.dtype, self.target.device
        if valid is None:  # one compacted sequence
            (buf, chain), draft = bufs[0], drafts[0]
            ids = torch.tensor([[roots[0], *draft.tokens]])
            if chain:
                return ids, None, None
            positions = buf.depth + npos[0]  # [n+1]
            mask = tree_mask(self.target.config, buf.visible, npos[0], positions, dtype, positions)
            mask = {k: m.to(device) for k, m in mask.items()} if isinstance(mask, dict) else mask.to(device)
            return ids, positions.unsqueeze(0), mask
        B, W = len(drafts), 1 + max(d.n for d in drafts)
        ids = torch.full((B, W), self.pad_id, dtype=torch.long)
        # [B, W]; padding slots just need a finite position
        pos = torch.tensor(npos).unsqueeze(1).repeat(1, W)
        own = torch.eye(W, dtype=torch.bool).repeat(B, 1, 1)  # [B, W, W]: every slot sees itself
        for b, (draft, (buf, _)) in enumerate(zip(drafts, bufs)):
            if roots[b] is None:
                continue
            n = draft.n
            ids[b, : n + 1] = torch.tensor([roots[b], *draft.tokens])
            pos[b, : n + 1] += buf.depth
            own[b, : n + 1, : n + 1] = buf.visible
        L = valid.shape[1]
        allowed = torch.cat([valid[:, None, :].expand(B, W, L), own.to(device)], -1)  # [B, W, L+W]
        return ids, pos, additive_mask(allowed, dtype)

    def _verify_branches(self, root: int, draft, buf: TreeBuffers, cache,
                         layers) -> tuple[TargetOutput, list]:
        """A tree's verification on a target with recurrent layers (which read a sequence, not a tree): every
        root-to-leaf path as one batch row of the same prefix (right-padded, so padding follows what it could
        change), its recurrent states recorded; -> the outputs at the tree's n + 1 entries in tree-index order
        and the rows' paths (the accepted row is kept afterwards, `kv_cache.keep_row`)."""
        tokens, paths = [root, *draft.tokens], buf.root_paths()
        depth = max(map(len, paths))
        ids = torch.tensor(
            [[tokens[j] for j in path] + [self.pad_id] * (depth - len(path)) for path in paths])
        expand(cache, len(paths))
        with recorded(self.target.model, cache, depth):
            out = self.target.forward(ids.to(self.target.device), cache=cache, use_cache=True, layers=layers)
        # where each tree entry was computed (any row holding it)
        row, col = [0] * (buf.n + 1), [0] * (buf.n + 1)
        for r, path in enumerate(paths):
            for c, j in enumerate(path):
                row[j], col[j] = r, c
        at = (torch.tensor(row, device=out.logits.device), torch.tensor(col, device=out.logits.device))
        hidden = {k: h[at].unsqueeze(0) for k, h in out.hidden.items()}  # [1, n+1, H]
        return TargetOutput(out.logits[at].unsqueeze(0), hidden), paths  # logits [1, n+1, V]

    def _generate(self, prompts: list[list[int]], max_new: int, sampling: SamplingConfig, generator):
        target, device, B = self.target, self.target.device, len(prompts)
        # one sequence (checked): drafts are rolled back through recorded states
        stateful = recurrent(target.config)
        proposers = self.proposers(B)
        layers = tuple(dict.fromkeys(k for p in proposers for k in p.feature_layers))
        cache = new_cache(target.config)
        first, valid, features = self._prefill(prompts, cache, layers, sampling, generator)
        results = [GenerationResult(output_ids=[tok]) for tok in first]
        contexts = [p + [tok] for p, tok in zip(prompts, first)]
        npos = [len(p) for p in prompts]  # valid tokens of each sequence = the RoPE position of its root
        for proposer, prompt, feats in zip(proposers, prompts, features):
            proposer.begin(prompt, feats)
        live = [tok not in self.eos and max_new > 1 for tok in first]
        steps, phases, clock = 0, dict.fromkeys(("draft", "verify", "accept"), 0.0), time.perf_counter
        while any(live):
            start = clock()
            drafts = [p.propose(c, sampling, generator) if on else EMPTY_DRAFT
                      for p, c, on in zip(proposers, contexts, live)]
            sync(device)
            drafted = clock()
            bufs = [tree_buffers(tuple(d.parents)) for d in drafts]
            roots = [c[-1] if on else None for c, on in zip(contexts, live)]
            ids, pos, mask = self._step_inputs(roots, drafts, bufs, npos, valid)
            branches = None
            if stateful and not bufs[0][1]:  # a tree on a recurrent target: one branch per batch row
                out, branches = self._verify_branches(roots[0], drafts[0], bufs[0][0], cache, layers)
            else:
                # recurrent layers: every verified token's state kept (heads/runtime/short_scan.py)
                with recorded(target.model, cache, ids.shape[1]) if stateful else nullcontext():
                    out = target.forward(ids.to(device), attention_mask=mask,
                                         position_ids=None if pos is None else pos.to(device), cache=cache,
                                         use_cache=True, layers=layers)
            sync(device)  # (the greedy rule's .tolist() below would wait here anyway)
            verified = clock()
            steps += 1
            prefix, kept = npos[0], torch.zeros(ids.shape, dtype=torch.bool)
            # greedy rows without a draft (plain decoding) read one batched argmax: one sync, not B
            plain = out.logits[:, 0].argmax(-1).tolist() if sampling.greedy and any(d.n == 0
                                                                                    for d in drafts) else None
            for b in (b for b in range(B) if live[b]):
                draft, (buf, _), rows = drafts[b], bufs[b], out.logits[b, : drafts[b].n + 1]  # rows [n+1, V]
                if plain is not None and draft.n == 0:
                    verdict = Verdict([], [plain[b]])
                elif sampling.greedy:
                    verdict = verify_greedy(draft.tokens, buf, rows)
                else:
                    verdict = verify_sampling(draft.tokens, buf, logits_to_probs(rows, sampling), draft.probs,
                                              generator)
                keep = [0, *verdict.accepted]  # tree indices = slots of this step: root + accepted path
                kept[b, keep] = True
                npos[b] += len(keep)
                # the depth drafted below the accepted path: a path that ends at a leaf tried nothing deeper
                reach = buf.reach(verdict.accepted[-1] if verdict.accepted else 0) if draft.n else 0
                new = results[b].record(verdict.tokens, reach, len(verdict.accepted), self.eos, max_new)
                contexts[b] += new
                live[b] = new[-1] not in self.eos and results[b].new_tokens < max_new
                if live[b]:
                    index = torch.tensor(keep, device=device)
                    proposers[b].commit(new, {k: h[b].index_select(0, index) for k, h in out.hidden.items()})
            if branches is not None:  # the row whose path holds the accepted one, cut after it
                keep_row(cache, next(r for r, path in enumerate(branches) if path[: len(keep)] == keep),
                         prefix + len(keep))
            elif valid is None:
                compact_cache(cache, prefix, keep)
            else:
                valid = torch.cat([valid, kept.to(device)], 1)  # [B, L+W]
                # npos = valid count
                if valid.shape[1] - max(npos) > max(16, self.repack_fraction * valid.shape[1]):
                    valid = repack_cache(cache, valid)
            sync(device)  # a GPU: the step's cache upkeep is charged to it, not to the next step's drafting
            phases["draft"] += drafted - start
            phases["verify"] += verified - drafted
            phases["accept"] += clock() - verified
        return results, steps, phases


def hf_generate_batch(target: Target, prompts: list[list[int]], max_new_tokens: int,
                      sampling: SamplingConfig | None = None, **kwargs) -> tuple[list[list[int]], float]:
    """HF `generate` (left-padded, cut after EOS) on the same timer: (new token ids per prompt, seconds)."""
    s = sampling or SamplingConfig()
    answers, seconds = timed(lambda: target.generate(prompts, max_new_tokens, s.temperature, s.top_p, s.top_k,
                                                     **kwargs),
                             target.device)
    return [ids for ids, _ in answers], seconds


def hf_generate(target: Target, prompt_ids: list[int], max_new_tokens: int,
                sampling: SamplingConfig | None = None, **kwargs) -> tuple[list[int], float]:
    """HF `generate` of one prompt: (new token ids, seconds). The peer every table cites."""
    outs, seconds = hf_generate_batch(target, [prompt_ids], max_new_tokens, sampling, **kwargs)
    return outs[0], seconds
