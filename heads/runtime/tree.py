"""Draft trees: from a list of paths to the buffers one verification forward needs.

Where it sits: a proposer (``eval/serving.py``) fills a draft tree with tokens; the decoder feeds
root + nodes to the target in ONE forward using the mask and position ids built here; ``verify.py``
walks the tree with ``children`` to pick the accepted path; ``kv_cache.py`` keeps that path.

Conventions (shared with verify.py and kv_cache.py):

- A tree has ``n`` nodes (draft tokens) and a root, the last accepted token (not yet in the KV cache).
- ``parents[i]`` is -1 when node i hangs off the root, else an earlier node index (topological order).
- "Tree index" j in 0..n: j = 0 is the root, j = i + 1 is node i. The verification forward sees the
  n + 1 tokens in tree-index order, so target logits are ``[n+1, V]`` with row j = next-token
  distribution after the path root -> ... -> j.

Shapes: ``depth [n+1]``, ``visible [n+1, n+1]``, ``verification_mask -> [1, 1, n+1, prefix_len+n+1]``,
``position_ids -> [1, n+1]``.

Trees are written as Medusa-style paths of per-depth top-k ranks: ``[[0], [1], [0, 0]]`` is the
rank-0 and rank-1 candidates at depth 1, plus the rank-0 continuation of the rank-0 candidate.
Shipped trees are package data (``configs/trees``); ``serving_tree`` is the one rule for which tree a
drafter serves with (a config override, else what its folder recorded, else the kind's default).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from draftsmith.configs import shipped
from draftsmith.heads.runtime.kv_cache import masks_by_layer_type, sliding_window

TREES_DIR = shipped("trees")
_CHAIN_NAME = re.compile(r"^chain-(\d+)$")
_DYNAMIC_NAME = re.compile(r"^dynamic-(\d+)$")


def chain_entry(length: int) -> dict:
    """The draftsmith.json "tree" entry of one chain of `length` draft tokens (a draft LM's serving shape)."""
    return {"paths": [[0] * d for d in range(1, length + 1)], "label": f"chain-{length}"}


@dataclass(frozen=True)
class ServingTree:
    """The draft shape a drafter serves with: static rank `paths`, or an EAGLE-2 dynamic tree (`topk`
    children per expanded node, `depth` levels, `budget` nodes verified)."""

    paths: list | None = None
    topk: int = 0
    depth: int = 0
    budget: int = 0
    label: str = ""

    @property
    def dynamic(self) -> bool:
        return self.paths is None

    @property
    def nodes(self) -> int:
        return self.budget if self.dynamic else len(self.paths)

    @classmethod
    def from_entry(cls, entry: dict) -> ServingTree:
        """A draftsmith.json "tree" entry whose static paths are inline (heads/folder.py reads a `file`
        entry's)."""
        if "paths" in entry:
            paths = entry["paths"]
            return cls(paths=[list(p) for p in paths], label=entry.get("label") or f"static-{len(paths)}")
        topk, depth, budget = int(entry["topk"]), int(entry["depth"]), int(entry["budget"])
        return cls(topk=topk, depth=depth, budget=budget, label=f"dynamic-k{topk}-d{depth}-n{budget}")

    def entry(self) -> dict:
        """The draftsmith.json "tree" entry of this tree."""
        if self.dynamic:
            return {"topk": self.topk, "depth": self.depth, "budget": self.budget}
        return {"paths": self.paths, "label": self.label}


def chain_parents(n: int) -> list[int]:
    """Parents of a chain of ``n`` draft tokens: [-1, 0, 1, ..., n-2]."""
    if n < 0:
        raise ValueError(f"chain length must be >= 0, got {n}")
    return list(range(-1, n - 1))


def paths_to_parents(paths: list[list[int]]) -> tuple[list[int], list[int]]:
    """Turn rank paths into (parents, ranks), nodes sorted by (depth, path) like Medusa.

    ``ranks[i]`` is the last rank of node i's path: which top-k candidate the proposer puts there.
    """
    keys: list[tuple[int, ...]] = []
    for path in paths:
        key = tuple(path)
        if not key:
            raise ValueError(f"empty path {list(path)!r} in tree")
        if any(not isinstance(r, int) or isinstance(r, bool) or r < 0 for r in key):
            raise ValueError(f"path {list(path)!r} has a rank that is not a non-negative int")
        keys.append(key)
    keys.sort(key=lambda k: (len(k), k))
    index: dict[tuple[int, ...], int] = {}
    parents: list[int] = []
    for i, key in enumerate(keys):
        if key in index:
            raise ValueError(f"duplicate path {list(key)!r} in tree")
        prefix = key[:-1]
        if prefix and prefix not in index:
            raise ValueError(f"path {list(key)!r} has no parent: its prefix {list(prefix)!r} is missing")
        parents.append(index[prefix] if prefix else -1)
        index[key] = i
    return parents, [key[-1] for key in keys]


@dataclass
class TreeBuffers:
    """Static index buffers of one tree shape (see the module docstring for the conventions)."""

    parents: list[int]  # len n
    depth: torch.Tensor  # [n+1] long, root 0
    visible: torch.Tensor  # [n+1, n+1] bool, row j sees itself and its ancestors
    children: list[list[int]]  # len n+1, children tree indices in node order

    @property
    def n(self) -> int:
        return len(self.parents)

    @property
    def max_depth(self) -> int:
        return int(self.depth.max())

    def reach(self, node: int) -> int:
        """The deepest depth of the subtree under tree index `node` (itself included)."""
        return int(self.depth[self.visible[:, node].to(self.depth.device)].max())

    def root_paths(self) -> list[list[int]]:
        """Every root-to-leaf path in tree indices (0 = the root), leaves in tree-index order: how a tree is
        verified one branch per batch row on a target whose recurrent layers read a sequence, not a tree."""
        up = [-1] + [p + 1 for p in self.parents]
        paths = []
        for leaf in (j for j in range(self.n + 1) if not self.children[j]):
            path = [leaf]
            while up[path[-1]] >= 0:
                path.append(up[path[-1]])
            paths.append(path[::-1])
        return paths

    def to(self, device: torch.device | str) -> TreeBuffers:
        """The same buffers with the tensors on ``device``."""
        return TreeBuffers(
            parents=self.parents,
            depth=self.depth.to(device),
            visible=self.visible.to(device),
            children=self.children,
        )


def build_tree_buffers(parents: list[int]) -> TreeBuffers:
    """Depth, ancestor-visibility mask and child lists of a tree."""
    parents = [int(p) for p in parents]
    n = len(parents)
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"parents[{i}] = {p}: must be -1 (root) or an earlier node index in 0..{i - 1}")
    up = [-1] + [p + 1 for p in parents]  # tree index of each tree index's parent; root has none
    depth = [0] * (n + 1)
    visible = torch.eye(n + 1, dtype=torch.bool)  # [n+1, n+1]
    children: list[list[int]] = [[] for _ in range(n + 1)]
    for j in range(1, n + 1):
        depth[j] = depth[up[j]] + 1
        visible[j] |= visible[up[j]]  # topological order: the parent's row is already complete
        children[up[j]].append(j)
    return TreeBuffers(parents=parents, depth=torch.tensor(depth, dtype=torch.long), visible=visible,  # [n+1]
                       children=children)


def verification_mask(visible: torch.Tensor, prefix_len: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask for a tree forward: 0 where attention is allowed, dtype-min elsewhere.

    ``visible [r, c]`` says which of the c appended entries each of the r new rows may see (its
    ancestors and itself); every row also sees the whole cached prefix. Square for the target's
    verification forward; a row subset when a drafter appends one tree level at a time.
    The dtype must be the model's: eager attention adds the mask to the scores.
    Returns ``[1, 1, r, prefix_len + c]`` on ``visible``'s device.
    """
    rows, cols = visible.shape
    mask = torch.zeros(1, 1, rows, prefix_len + cols, dtype=dtype, device=visible.device)  # [1, 1, r, P+c]
    mask[0, 0, :, prefix_len:].masked_fill_(~visible, torch.finfo(dtype).min)
    return mask


def tree_mask(config, visible: torch.Tensor, prefix_len: int, positions: torch.Tensor, dtype: torch.dtype,
              key_positions: torch.Tensor):
    """The attention mask of a tree forward for `config`'s model: `verification_mask`, or for a model with
    sliding-window layers the same with every key that lies a window or more behind its query masked too, as
    {"full_attention": ..., "sliding_attention": ...} for models that read a mask per layer type
    (`layer_types`: Gemma-3, gpt-oss) and as the windowed tensor alone for models whose every layer slides
    (Mistral-style). `positions [r]` are the new rows' positions, `key_positions [c]` those of the c appended
    entries `visible` has columns for; the prefix keys sit at 0..prefix_len-1. The window applies among the
    tree's own entries as well: a node `window` levels below an ancestor must not see it in a sliding layer
    (HF's rule: key k is seen from query q iff q - k < window)."""
    full = verification_mask(visible, prefix_len, dtype)  # [1, 1, r, P+c]
    window = sliding_window(config)
    if window is None:
        return full
    positions = positions.to(visible.device)
    # [P+c]
    keys = torch.cat([torch.arange(prefix_len, device=visible.device), key_positions.to(visible.device)])
    far = keys[None, :] <= positions[:, None] - window  # [r, P+c]: outside the window
    sliding = full.masked_fill(far[None, None], torch.finfo(dtype).min)
    return {"full_attention": full, "sliding_attention": sliding} if masks_by_layer_type(config) else sliding


def position_ids(depth: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """Position of each tree entry: a node sits at prefix_len + its depth. Returns ``[1, n+1]``."""
    return (depth + prefix_len).unsqueeze(0)  # [1, n+1]


def available_trees() -> list[str]:
    """Names ``load_tree`` accepts: the shipped tree files plus the ``chain-N`` family."""
    return sorted(p.stem for p in TREES_DIR.glob("*.json")) + ["chain-N"]


def load_tree(name_or_path: str | Path) -> list[list[int]]:
    """Paths of a tree given a JSON file, a shipped tree name or ``chain-N`` (N >= 1).

    The JSON holds a list of paths or ``{"paths": [...]}``. The paths are validated on load.
    """
    text = str(name_or_path)
    chain = _CHAIN_NAME.match(text)
    if chain:
        length = int(chain.group(1))
        if length < 1:
            raise ValueError(f"{text!r}: a chain needs at least one node")
        return chain_entry(length)["paths"]
    path = Path(name_or_path)
    if not path.is_file():
        path = TREES_DIR / f"{text}.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"unknown tree {text!r}: not a file, and not one of {', '.join(available_trees())}"
        )
    data = json.loads(path.read_text())
    paths = data["paths"] if isinstance(data, dict) else data
    if not isinstance(paths, list) or not all(isinstance(p, list) for p in paths):
        raise ValueError(f"{path}: expected a list of paths (lists of ranks) or {{'paths': [...]}}")
    paths_to_parents(paths)
    return paths


def topk_chain_paths(k: int, depth: int) -> list[list[int]]:
    """k branches at the root (its top-k tokens), each continued greedily to `depth`."""
    return [[i] + [0] * d for i in range(k) for d in range(depth)]


def serving_tree(cfg, recorded: ServingTree | None, default: str | ServingTree,
                 dynamic: bool = False) -> ServingTree:
    """The tree a drafter serves with; `cfg` is its DrafterConfig, `recorded` what its folder says.

    In order: `drafter.tree` (a shipped name, a JSON file, `chain-N`, or `dynamic-N` where `dynamic`);
    `drafter.tree_nodes > 0` for kinds that draft dynamic trees (an EAGLE-2 tree of that budget, `tree_topk`
    wide, `num_speculative_tokens` deep); `top_k > 1` top-k chains of `num_speculative_tokens`; the tree the
    folder recorded (a draft LM records its chain); else `default` (a tree name such as `chain-5`, or a
    tree)."""
    depth = cfg.num_speculative_tokens
    match = _DYNAMIC_NAME.match(cfg.tree or "")
    if dynamic and match:
        return ServingTree(topk=cfg.tree_topk, depth=depth, budget=int(match.group(1)),
                           label=f"dynamic-k{cfg.tree_topk}-d{depth}-n{match.group(1)}")
    if cfg.tree:  # a file is labelled by its name, not its path (tables and plots print it)
        label = Path(cfg.tree).stem if str(cfg.tree).endswith(".json") else str(cfg.tree)
        return ServingTree(paths=load_tree(cfg.tree), label=label)
    if dynamic and cfg.tree_nodes > 0:
        return ServingTree(topk=cfg.tree_topk, depth=depth, budget=cfg.tree_nodes,
                           label=f"dynamic-k{cfg.tree_topk}-d{depth}-n{cfg.tree_nodes}")
    if cfg.top_k > 1:
        return ServingTree(paths=topk_chain_paths(cfg.top_k, depth), label=f"top{cfg.top_k}-chains-{depth}")
    if recorded is not None:
        return recorded
    return default if isinstance(default, ServingTree) else ServingTree(paths=load_tree(default),
                                                                        label=default)
