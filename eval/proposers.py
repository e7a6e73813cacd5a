"""Proposers: everything that drafts tokens for the tree-verification decoder, behind one interface.

In the flow: `eval/decoder.py` asks a proposer for a `Draft` each step, verifies it with one target
forward, and tells the proposer what was accepted. A proposer sees the token context (prompt +
everything emitted, the last token being the root that the target has not processed yet) and,
if it asks for them through `feature_layers`, the target's hidden states at the processed
positions (EAGLE-style drafters; features lag the context by the root token).

A `Draft` is a tree: n tokens with parents (-1 = root, else an earlier node), and optionally the
distributions `probs [n, V]` the tokens were drawn from (None = chosen deterministically, e.g.
top-k; exact sampling then treats each as a point mass).

Kinds here: `prompt-lookup` (n-gram match in the context), `draft-lm` (any HF causal LM with the
target's tokenizer, chain or top-k tree, its own KV cache), `layer-skip` (the target's first N
layers + final norm + lm_head: a draft LM that shares the target's weights). Trained kinds
(Medusa, EAGLE) plug in through `build_proposer`.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import DynamicCache

from draftsmith.distill.target import Target
from draftsmith.eval import kv_cache
from draftsmith.eval.tree import (
    build_tree_buffers,
    chain_parents,
    load_tree,
    paths_to_parents,
    verification_mask,
)
from draftsmith.eval.verify import SamplingConfig, logits_to_probs
from draftsmith.heads.registry import DrafterConfig


@dataclass
class Draft:
    tokens: list[int]
    parents: list[int]
    probs: torch.Tensor | None = None  # [n, V]: distribution each token was drawn from

    @property
    def n(self) -> int:
        return len(self.tokens)


EMPTY_DRAFT = Draft(tokens=[], parents=[])


class Proposer:
    """Base interface; the default proposes nothing (plain autoregressive decoding)."""

    name = "none"
    tree = "none"  # label of the draft shape, reported in eval summaries
    feature_layers: tuple[int | str, ...] = ()

    def begin(self, prompt_ids: list[int], features: dict[int, torch.Tensor]) -> None:
        """A new sequence: the prompt was prefilled; features are `{layer: [T, H]}` of its tokens."""

    def propose(self, context: list[int], sampling: SamplingConfig, generator: torch.Generator | None) -> Draft:
        return EMPTY_DRAFT

    def commit(self, new_tokens: list[int], features: dict[int, torch.Tensor]) -> None:
        """`new_tokens` (accepted drafts + bonus) were appended to the context; features are those
        of the positions the target verified and kept (root + accepted nodes): `{layer: [k, H]}`."""


class PromptLookupProposer(Proposer):
    """Copy the continuation of the most recent earlier occurrence of the context's suffix n-gram."""

    name = "prompt-lookup"

    def __init__(self, num_tokens: int = 5, ngram_max: int = 3, ngram_min: int = 1):
        self.num_tokens, self.ngram_max, self.ngram_min = num_tokens, ngram_max, ngram_min

    def propose(self, context, sampling, generator) -> Draft:
        T = len(context)
        for n in range(min(self.ngram_max, T - 1), self.ngram_min - 1, -1):
            suffix = context[T - n:]
            for start in range(T - n - 1, -1, -1):  # most recent match first, never the suffix itself
                if context[start: start + n] == suffix:
                    cont = context[start + n: start + n + self.num_tokens]
                    if cont:
                        return Draft(tokens=list(cont), parents=chain_parents(len(cont)))
        return EMPTY_DRAFT


def topk_chain_paths(k: int, depth: int) -> list[list[int]]:
    """k branches at the root (its top-k tokens), each continued greedily to `depth`."""
    return [[i] + [0] * d for i in range(k) for d in range(depth)]


class DraftModelProposer(Proposer):
    """A causal LM drafts along a static tree of ranks (Medusa-style paths; a chain is [[0],[0,0],..]).

    Level by level: the newest level's nodes are fed in one forward with a tree mask, and each child
    takes the rank-r token of its parent's distribution. Its KV cache keeps the longest prefix it
    shares with the context; drafted nodes are dropped again after proposing. A chain at T > 0 is
    sampled from the drafter's own (warped) distribution and passes q for exact verification; trees
    are deterministic top-k (q = point mass), which verification also handles exactly.
    """

    name = "draft-lm"

    def __init__(self, model: torch.nn.Module, paths: list[list[int]]):
        self.model = model.eval().requires_grad_(False)
        self.parents, self.ranks = paths_to_parents(paths)
        self.bufs = build_tree_buffers(self.parents)
        self.is_chain = all(r == 0 for r in self.ranks) and self.parents == chain_parents(len(self.parents))
        depth = self.bufs.depth[1:].tolist()
        self.levels = [[i for i, d in enumerate(depth) if d == level] for level in range(1, max(depth) + 1)]
        self.max_rank = max(self.ranks) + 1
        self.cache = DynamicCache(config=model.config)
        self.cached: list[int] = []  # tokens whose KV is in self.cache

    def begin(self, prompt_ids, features) -> None:
        self.cache = DynamicCache(config=self.model.config)
        self.cached = []

    def _forward(self, ids: list[int], **kw) -> torch.Tensor:
        device = next(self.model.parameters()).device
        x = torch.tensor([ids], device=device)
        return self.model(input_ids=x, cache=self.cache, use_cache=True, **kw).logits[0]  # [k, V]

    def _sync(self, context: list[int]) -> torch.Tensor:
        """Bring the cache to `context` (crop to the shared prefix, feed the rest) -> last logits [V]."""
        shared, limit = 0, min(len(self.cached), len(context) - 1)  # the root is always fed: its logits
        while shared < limit and self.cached[shared] == context[shared]:
            shared += 1
        kv_cache.crop_cache(self.cache, shared)
        logits = self._forward(context[shared:], logits_to_keep=1)[-1]  # [V]
        self.cached = list(context)
        return logits

    def propose(self, context, sampling, generator) -> Draft:
        logits = self._sync(context)  # [V]
        if self.is_chain and not sampling.greedy:
            return self._sampled_chain(logits, sampling, generator)
        tokens = [0] * len(self.parents)
        dist = {-1: torch.topk(logits, self.max_rank).indices.tolist()}  # node -> its top ranks
        base, dtype = len(context), next(self.model.parameters()).dtype
        for level, nodes in enumerate(self.levels):
            for i in nodes:
                tokens[i] = dist[self.parents[i]][self.ranks[i]]
            if level + 1 == len(self.levels):
                break
            end = nodes[-1] + 1  # nodes are ordered by depth: everything before `end` is drafted
            rows = [i + 1 for i in nodes]
            mask = pos = None  # a chain is plain causal decoding: the model's own mask and positions
            if not self.is_chain:
                mask = verification_mask(self.bufs.visible[rows, 1: end + 1], base, dtype)  # [1, 1, k, base+end]
                pos = (base - 1 + self.bufs.depth[rows]).unsqueeze(0)  # [1, k]: the root sits at base-1
            top = self._forward([tokens[i] for i in nodes], attention_mask=mask, position_ids=pos)  # [k, V]
            for i, ranks in zip(nodes, torch.topk(top, self.max_rank, dim=-1).indices.tolist()):
                dist[i] = ranks
        kv_cache.crop_cache(self.cache, len(context))
        return Draft(tokens=tokens, parents=self.parents)

    def _sampled_chain(self, logits, sampling, generator) -> Draft:
        tokens, probs = [], []
        for depth in range(len(self.parents)):
            q = logits_to_probs(logits, sampling)  # [V]
            tokens.append(int(torch.multinomial(q, 1, generator=generator)))
            probs.append(q)
            if depth + 1 < len(self.parents):
                logits = self._forward(tokens[-1:])[-1]
                self.cached.append(tokens[-1])
        return Draft(tokens=tokens, parents=self.parents, probs=torch.stack(probs))  # probs [n, V]


class MedusaProposer(Proposer):
    """Medusa heads on the target's final-normed hidden state at the last verified position.

    Head k's top-r token fills every tree node at depth k+1 with rank r (Medusa's cartesian tree:
    a node's token does not depend on its parent's). The tree comes from `drafter.tree`
    (`configs/trees/medusa-k4-default.json` for 4 heads) and may not be deeper than the heads.
    """

    name = "medusa"
    feature_layers = ("final",)

    def __init__(self, heads: torch.nn.Module, paths: list[list[int]]):
        self.heads = heads.eval().requires_grad_(False)
        self.parents, self.ranks = paths_to_parents(paths)
        depth = build_tree_buffers(self.parents).depth[1:].tolist()
        if max(depth) > heads.num_heads:
            raise ValueError(f"tree depth {max(depth)} exceeds the {heads.num_heads} Medusa heads; pick a shallower "
                             "drafter.tree or train more heads (drafter.medusa_heads)")
        self.head_of = [d - 1 for d in depth]
        self.max_rank = max(self.ranks) + 1
        self.last: torch.Tensor | None = None  # [H] final hidden state of the last verified position

    def begin(self, prompt_ids, features) -> None:
        self.last = features["final"][-1]

    def commit(self, new_tokens, features) -> None:
        self.last = features["final"][-1]

    def propose(self, context, sampling, generator) -> Draft:
        x = self.last.to(self.heads_dtype)  # [H]
        # only the heads the tree reaches: each costs a V-wide matmul per step
        logits = torch.stack([head(x) for head in self.heads.heads[: max(self.head_of) + 1]])  # [depth, V]
        top = logits.topk(self.max_rank, dim=-1).indices.tolist()  # [depth][r]
        return Draft(tokens=[top[h][r] for h, r in zip(self.head_of, self.ranks)], parents=self.parents)

    @property
    def heads_dtype(self) -> torch.dtype:
        return next(self.heads.parameters()).dtype


def truncated_target(target: Target, num_layers: int) -> torch.nn.Module:
    """The target's first `num_layers` layers + final norm + lm_head, sharing the target's weights.

    HF decoders run `layers[: config.num_hidden_layers]`, so a shallow copy with its own config
    is the truncated model — no new parameters, no forked modeling code.
    """
    if not 1 <= num_layers < target.num_layers:
        raise ValueError(f"drafter.layer_skip_layers must be in [1, {target.num_layers - 1}], got {num_layers}")
    config = copy.deepcopy(target.model.config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:num_layers]
    model = copy.copy(target.model)
    model._modules = dict(model._modules)
    inner = copy.copy(target.model.get_decoder())
    inner._modules = dict(inner._modules)
    inner.config = config
    model.config = config
    for name, mod in model._modules.items():
        if mod is target.model.get_decoder():
            model._modules[name] = inner
    return model


def check_compatible(target: Target, model: torch.nn.Module, tokenizer=None, where: str = "drafter") -> None:
    """Refuse, before any work, a drafter whose vocabulary or tokenizer differs from the target's."""
    v_t, v_d = target.vocab_size, model.get_output_embeddings().weight.shape[0]
    if v_t != v_d:
        raise ValueError(f"{where}: vocabulary size {v_d} differs from the target's {v_t}; a drafter must use "
                         "the target's tokenizer (train one with draftsmith, or pick a draft model of the same family)")
    if tokenizer is not None and tokenizer.get_vocab() != target.tokenizer.get_vocab():
        raise ValueError(f"{where}: tokenizer differs from the target's (same size {v_t}, different tokens); "
                         "speculative decoding needs identical token ids")


def load_draft_lm(path: str | Path, target: Target) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"drafter.path '{path}' is not an HF model folder (no config.json)")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=target.dtype).to(target.device)
    tokenizer = AutoTokenizer.from_pretrained(path) if (path / "tokenizer_config.json").is_file() else None
    check_compatible(target, model, tokenizer, where=f"draft model {path}")
    return model


def load_trained(path: str | None, target: Target, kind: str) -> torch.nn.Module:
    """A trained drafter of `kind` from a draftsmith drafter folder or any of its serving exports."""
    from draftsmith.heads.export import load_export
    from draftsmith.heads.registry import load_drafter

    if not path:
        raise ValueError(f"drafter.kind {kind} needs drafter.path (a trained drafter folder or one of its exports)")
    folder = Path(path)
    if (folder / "draftsmith.json").is_file():
        drafter = load_drafter(folder, target_model=target.model)
    else:
        drafter = load_export(folder, target.model)
    if drafter.kind != kind:
        raise ValueError(f"{folder} holds a {drafter.kind} drafter, not {kind}: fix drafter.kind or drafter.path")
    if drafter.vocab_size != target.vocab_size or drafter.hidden_size != target.config.hidden_size:
        raise ValueError(f"the {kind} drafter in {folder} is for hidden {drafter.hidden_size} / vocab {drafter.vocab_size}, "
                         f"the target has {target.config.hidden_size} / {target.vocab_size}: trained for another target")
    drafter = drafter.to(device=target.device)
    for param in drafter.parameters():  # parameters only: buffers such as RoPE's inv_freq stay fp32 (rounded
        param.data = param.data.to(target.dtype)  # to bf16 it would shift every position's angle)
    return drafter


def eagle_tree(cfg: DrafterConfig, saved: dict | None = None) -> dict:
    """EagleProposer arguments: `drafter.tree` names a static tree or `dynamic-N`; else `tree_nodes` > 0 is a
    dynamic tree of that budget (EAGLE-2); else the dynamic tree the drafter was trained with (`saved`, from
    its draftsmith.json); else a chain of `num_speculative_tokens`."""
    depth, tree = cfg.num_speculative_tokens, cfg.tree
    if tree and tree.startswith("dynamic-") and tree[8:].isdigit():
        return {"topk": cfg.tree_topk, "depth": depth, "budget": int(tree[8:])}
    if tree:
        return {"paths": load_tree(tree)}
    if cfg.tree_nodes > 0:
        return {"topk": cfg.tree_topk, "depth": depth, "budget": cfg.tree_nodes}
    if saved:
        return dict(saved)
    return {"topk": 1, "depth": depth, "budget": depth}


def draft_paths(cfg: DrafterConfig) -> list[list[int]]:
    """The static tree a drafter expands: `drafter.tree`, else top-k chains, else a chain."""
    if cfg.tree:
        return load_tree(cfg.tree)
    if cfg.top_k > 1:
        return topk_chain_paths(cfg.top_k, cfg.num_speculative_tokens)
    return load_tree(f"chain-{cfg.num_speculative_tokens}")


def build_proposer(cfg: DrafterConfig, target: Target) -> Proposer:
    """The proposer named by `drafter.kind` (a trained drafter folder names its kind in draftsmith.json)."""
    kind, path = cfg.kind, cfg.path
    if path and (Path(path) / "draftsmith.json").is_file():
        meta = json.loads((Path(path) / "draftsmith.json").read_text())
        kind = meta["kind"]
        served = {meta.get("target"), str(Path(path) / meta["serve_target"]) if meta.get("serve_target") else None}
        if meta.get("target") is not None and target.name not in served:
            raise ValueError(f"drafter {path} was trained for target '{meta['target']}'"
                             + (f" and is served with {path}/{meta['serve_target']}" if meta.get("serve_target") else "")
                             + f"; this run's target is '{target.name}': fix model.target or train for this target")
    if kind == "prompt-lookup":
        proposer = PromptLookupProposer(cfg.num_speculative_tokens, cfg.ngram_max, cfg.ngram_min)
        proposer.tree = f"chain-{cfg.num_speculative_tokens}"
        return proposer
    if kind == "medusa":
        heads = load_trained(path, target, "medusa")
        own = Path(path) / "tree.json"  # written by `pipeline` from the heads' measured accuracies
        tree = cfg.tree or (str(own) if own.is_file() else
                            "medusa-k4-default" if heads.num_heads >= 4 else f"chain-{heads.num_heads}")
        proposer = MedusaProposer(heads, load_tree(tree))
        proposer.tree = tree
        return proposer
    if kind in ("eagle", "eagle3"):
        from draftsmith.eval.eagle_proposer import EagleProposer

        drafter = load_trained(path, target, kind)
        return EagleProposer(drafter, **eagle_tree(cfg, getattr(drafter, "serving_tree", None)))
    if kind == "layer-skip":
        proposer = DraftModelProposer(truncated_target(target, cfg.layer_skip_layers), draft_paths(cfg))
        proposer.name = "layer-skip"
    elif kind == "draft-lm":
        if not path:
            raise ValueError("drafter.kind draft-lm needs drafter.path (an HF model folder with the target's tokenizer)")
        proposer = DraftModelProposer(load_draft_lm(path, target), draft_paths(cfg))
    else:
        raise ValueError(f"drafter.kind '{kind}' has no proposer yet")
    proposer.tree = cfg.tree or (f"top{cfg.top_k}-chains-{cfg.num_speculative_tokens}" if cfg.top_k > 1
                                 else f"chain-{cfg.num_speculative_tokens}")
    return proposer
