"""Draft models: any causal LM on the target's tokenizer drafts a chain or a static tree of ranks.

Two kinds run on this proposer: `draft-lm` (an HF model folder as `drafter.path`: a distilled
student's drafter folder, its `hf` export, or any same-tokenizer model) and `layer-skip` (the
target's first `drafter.layer_skip.layers` layers + final norm + lm_head, sharing its weights,
untrained). Trees: `drafter.tree`, else `top_k > 1` top-k chains, else a chain of
`num_speculative_tokens` (`heads/runtime/tree.py serving_tree`). HF assisted generation runs the same draft
model (`hf_peer`, a bench peer).
"""

from __future__ import annotations

import copy

import torch

from draftsmith.distill.hf_compat import cache_kwargs
from draftsmith.distill.target import Target
from draftsmith.heads.runtime import kv_cache
from draftsmith.heads.runtime.proposer import Draft, Proposer
from draftsmith.heads.runtime.tree import (
    build_tree_buffers,
    chain_parents,
    paths_to_parents,
    serving_tree,
    tree_mask,
)
from draftsmith.heads.runtime.verify import logits_to_probs


class DraftModelProposer(Proposer):
    """A causal LM drafts along a static tree of ranks (Medusa-style paths; a chain is [[0],[0,0],..]).

    Level by level: the newest level's nodes are fed in one forward with a tree mask, and each child
    takes the rank-r token of its parent's distribution. Its KV cache keeps the longest prefix it
    shares with the context; drafted nodes are dropped again after proposing. A chain at T > 0 is
    sampled from the drafter's own (warped) distribution and passes q for exact verification; trees
    are deterministic top-k (q = point mass), which verification also handles exactly.
    """

    name = "draft-lm"

    def __init__(self, model: torch.nn.Module, paths: list[list[int]], confidence_threshold: float = 0.0,
                 adaptive_length: bool = False):
        self.model = model.eval().requires_grad_(False)
        # adaptive chains (HF assisted generation's rules): stop where the drafter's probability of its own
        # next token falls below the threshold; +2 tokens after a fully accepted draft, -1 otherwise
        self.threshold, self.adaptive = confidence_threshold, adaptive_length
        self.parents, self.ranks = paths_to_parents(paths)
        self.bufs = build_tree_buffers(self.parents)
        self.is_chain = all(r == 0 for r in self.ranks) and self.parents == chain_parents(len(self.parents))
        depth = self.bufs.depth[1:].tolist()
        self.levels = [[i for i, d in enumerate(depth) if d == level] for level in range(1, max(depth) + 1)]
        self.max_rank = max(self.ranks) + 1
        if not self.is_chain and kv_cache.recurrent(model.config):
            raise ValueError(f"a draft model with recurrent layers ({type(model).__name__}) drafts chains "
                             "only: its own tree would need a state per node; serve it with drafter.tree "
                             "chain-N")
        self.cache = kv_cache.new_cache(model.config)
        self.cached: list[int] = []  # tokens whose KV is in self.cache
        # the chain's current length (adaptive) and last draft's
        self.length = self.drafted = len(self.parents)

    def begin(self, prompt_ids, features) -> None:
        self.cache = kv_cache.new_cache(self.model.config)
        self.cached = []
        self.length = len(self.parents)

    def commit(self, new_tokens, features) -> None:
        if self.adaptive and self.is_chain:
            full = len(new_tokens) - 1 >= self.drafted  # every drafted token accepted (+ the bonus)
            self.length = min(len(self.parents), self.length + 2) if full else max(1, self.length - 1)

    def _forward(self, ids: list[int], **kw) -> torch.Tensor:
        device = next(self.model.parameters()).device
        x = torch.tensor([ids], device=device)
        # [k, V]
        return self.model(input_ids=x, use_cache=True, **cache_kwargs(self.model, self.cache), **kw).logits[0]

    def _sync(self, context: list[int]) -> torch.Tensor:
        """Bring the cache to `context` (crop to the shared prefix, feed the rest) -> last logits [V]."""
        shared, limit = 0, min(len(self.cached), len(context) - 1)  # the root is always fed: its logits
        while shared < limit and self.cached[shared] == context[shared]:
            shared += 1
        kv_cache.crop_cache(self.cache, shared)
        # recurrent layers: the single-token draft forwards that follow are recorded, so a rejected draft
        # rolls back (never into this forward: the next context keeps all of it)
        kv_cache.record(self.cache, 1)
        logits = self._forward(context[shared:], logits_to_keep=1)[-1]  # [V]
        self.cached = list(context)
        return logits

    def propose(self, context, sampling, generator) -> Draft:
        logits = self._sync(context)  # [V]
        if self.is_chain:
            return self._chain(logits, sampling, generator)
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
                pos = (base - 1 + self.bufs.depth[rows]).unsqueeze(0)  # [1, k]: the root sits at base-1
                keys = base - 1 + self.bufs.depth[1: end + 1]  # [end]: the drafted nodes' positions
                mask = tree_mask(self.model.config, self.bufs.visible[rows, 1: end + 1], base, pos[0], dtype,
                                 keys)
            top = self._forward([tokens[i] for i in nodes], attention_mask=mask, position_ids=pos)  # [k, V]
            for i, ranks in zip(nodes, torch.topk(top, self.max_rank, dim=-1).indices.tolist()):
                dist[i] = ranks
        kv_cache.crop_cache(self.cache, len(context))
        return Draft(tokens=tokens, parents=self.parents)

    def _chain(self, logits, sampling, generator) -> Draft:
        """A chain of up to `self.length` tokens: greedy (argmax) or sampled from the drafter's own warped law
        (then with its q rows). Confidence stop (HF's rule, transformers 5.25 `ConfidenceCriteria` in
        generation/stopping_criteria.py): a token whose drafter probability is below the threshold is KEPT
        and ends the draft after it. Every kept token is then a draw from its q row, and only the decision
        whether to draft the next one looks at it, so verification stays exact. Dropping the unconfident
        token instead (the rule before) keeps tokens from q restricted to confident ones while the verifier
        is told q: inexact at T > 0 (tests/unit/test_sampling.py, the old-rule twin)."""
        tokens, probs = [], []
        for depth in range(self.length):
            if sampling.argmax_drafts:  # no q rows: the verifier compares with the argmax, or q one-hot
                tok = int(logits.argmax())
            else:
                probs.append(logits_to_probs(logits, sampling))  # [V]
                tok = int(torch.multinomial(probs[-1], 1, generator=generator))
            tokens.append(tok)
            if self.threshold and float(logits.float().softmax(-1)[tok]) < self.threshold:
                break  # kept, and the draft ends after it
            if depth + 1 < self.length:
                logits = self._forward(tokens[-1:])[-1]
                self.cached.append(tokens[-1])
        self.drafted = len(tokens)
        return Draft(tokens=tokens, parents=chain_parents(len(tokens)),
                     probs=None if sampling.argmax_drafts else torch.stack(probs))  # probs [n, V]


def truncated_target(target: Target, num_layers: int) -> torch.nn.Module:
    """The target's first `num_layers` layers + final norm + lm_head, sharing the target's weights.

    A shallow copy of the model whose decoder holds the first layers (the same modules) and a config cut to
    them (every per-layer list too) is the truncated model — no new parameters, no forked modeling code.
    """
    if not 1 <= num_layers < target.num_layers:
        raise ValueError(f"drafter.layer_skip.layers must be in [1, {target.num_layers - 1}], got "
                         f"{num_layers}")
    if getattr(target.model.config, "is_heterogeneous", False):
        name = type(target.model).__name__
        raise ValueError(f"drafter.kind layer-skip takes the first layers of a uniform stack; {name} sets "
                         "its layers' fields one by one (per-layer inputs and head sizes): its first layers "
                         "are no model of their own; train a drafter instead")
    config = copy.deepcopy(target.model.config)
    # per-layer lists (layer_types, a hybrid's block pattern, ...)
    for key, value in config.to_dict().items():
        if isinstance(value, list) and len(value) == target.num_layers:
            try:
                setattr(config, key, value[:num_layers])
            except AttributeError:  # derived from another field (a property): follows it
                pass
    config.num_hidden_layers = num_layers
    model = copy.copy(target.model)
    model._modules = dict(model._modules)
    inner = copy.copy(target.model.get_decoder())
    inner._modules = dict(inner._modules)
    inner._modules["layers"] = torch.nn.ModuleList(list(target.layers)[:num_layers])  # shared, not copied
    inner.config = config
    model.config = config
    for name, mod in model._modules.items():
        if mod is target.model.get_decoder():
            model._modules[name] = inner
    return model



def load_draft_lm(folder, target: Target) -> torch.nn.Module:
    """The HF model of `folder` (heads/folder.py `DrafterFolder`), refused (vocabulary, tokenizer) before any
    work if it cannot draft for `target`."""
    from transformers import AutoModelForCausalLM

    folder.check_target(target.vocab_size, target.config.hidden_size, target.tokenizer, target.name,
                        model=target.model)
    model = AutoModelForCausalLM.from_pretrained(folder.path, dtype=target.dtype).to(target.device)
    if model.get_output_embeddings().weight.shape[0] != target.vocab_size:
        raise ValueError(f"draft model {folder.path}: vocabulary size "
                         f"{model.get_output_embeddings().weight.shape[0]} differs from the target's "
                         f"{target.vocab_size}; a drafter must use the target's tokenizer")
    return model


def proposer_for(model: torch.nn.Module, cfg, recorded=None, name: str = "draft-lm") -> DraftModelProposer:
    tree = serving_tree(cfg, recorded, default=f"chain-{cfg.num_speculative_tokens}")
    proposer = DraftModelProposer(model, tree.paths, cfg.confidence_threshold, cfg.adaptive_length)
    proposer.name = name
    proposer.tree = tree.label + ("-adaptive" if cfg.adaptive_length and proposer.is_chain else "") + \
        (f"-conf{cfg.confidence_threshold:g}" if cfg.confidence_threshold and proposer.is_chain else "")
    return proposer


def build_draft_lm(cfg, target: Target, folder=None) -> DraftModelProposer:
    if folder is None:
        raise ValueError("drafter.kind draft-lm needs drafter.path (an HF model folder with the target's "
                         "tokenizer)")
    return proposer_for(load_draft_lm(folder, target), cfg, folder.tree)


def build_layer_skip(cfg, target: Target, folder=None) -> DraftModelProposer:
    return proposer_for(truncated_target(target, cfg.settings.layers), cfg, name="layer-skip")


def hf_peer(cfg, target: Target, label: str, folder=None) -> tuple[str, dict] | None:
    """HF assisted generation with the same draft model (HF drafts chains with its own stopping rules)."""
    if folder is None:
        return None
    return f"hf-assisted-{label}", dict(assistant_model=load_draft_lm(folder, target))
