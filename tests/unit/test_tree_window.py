"""Sliding-window layers inside a draft tree: a node `window` or more levels below an ancestor must not see
it.

A tiny Gemma 3 (window 8, every other layer sliding) verifies a branching tree of depth 11 after a 12-token
prefix: each node's logits must equal a plain forward over prefix + root + its path (the model's own masks),
at every depth, and greedy decoding with an oracle tree of depth 11 must equal the target's own. Negative
twin: the window applied to the cached prefix only (the rule before: `heads/runtime/tree.py` masked old prefix
keys but let every node see all its ancestors) gives logits off at depth >= 8 and argmax flips.
"""

from __future__ import annotations

import pytest
import torch
from helpers import build_tiny_model

from draftsmith.distill.target import Target
from draftsmith.eval.decode import decoder as decoder_module
from draftsmith.eval.decode.decoder import SpeculativeDecoder, hf_generate
from draftsmith.heads.draft_lm.proposer import DraftModelProposer
from draftsmith.heads.runtime import kv_cache
from draftsmith.heads.runtime.proposer import Draft, Proposer
from draftsmith.heads.runtime.tree import build_tree_buffers, tree_mask

DEPTH, PREFIX = 11, 12
PARENTS = [-1] + list(range(DEPTH - 1)) + [0, 1, 7, 8]  # a chain of 11 and siblings at depths 2, 3, 9, 10

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def gemma():
    model = build_tiny_model("gemma3", layers=4, seed=3)
    assert model.config.sliding_window == 8 and DEPTH > model.config.sliding_window
    return model


def without_node_window(config, visible, prefix_len, positions, dtype, key_positions):
    """The twin: the window among the tree's own entries dropped (prefix keys still windowed)."""
    mask = tree_mask(config, visible, prefix_len, positions, dtype, key_positions)
    if isinstance(mask, dict):
        mask["sliding_attention"][..., prefix_len:] = mask["full_attention"][..., prefix_len:]
    return mask


def tree_logits(model, ids, mask_fn=tree_mask):
    """Logits [n+1, V] of root + tree nodes verified in one forward after PREFIX cached tokens."""
    prefix, tree = ids[:PREFIX], ids[PREFIX:]
    cache = kv_cache.new_cache(model.config)
    with torch.no_grad():
        model(input_ids=torch.tensor([prefix]), cache=cache, use_cache=True)
        buf = build_tree_buffers(PARENTS)
        positions = buf.depth + PREFIX  # [n+1]
        mask = mask_fn(model.config, buf.visible, PREFIX, positions, torch.float32, positions)
        return model(input_ids=torch.tensor([tree]), attention_mask=mask, position_ids=positions[None],
                     cache=cache, use_cache=True).logits[0]


def plain_logits(model, ids):
    """Each tree entry's logits by a plain forward over prefix + root + its path: [n+1, V]."""
    rows, paths = [], {0: [ids[PREFIX]]}
    for c, p in enumerate(PARENTS, start=1):
        paths[c] = paths[p + 1] + [ids[PREFIX + c]]
    with torch.no_grad():
        for j in range(len(PARENTS) + 1):
            rows.append(model(input_ids=torch.tensor([ids[:PREFIX] + paths[j]])).logits[0, -1])
    return torch.stack(rows)


def test_tree_nodes_past_the_window_match_plain_forwards(gemma):
    ids = torch.randint(3, 259, (PREFIX + 1 + len(PARENTS),),
                        generator=torch.Generator().manual_seed(0)).tolist()
    plain, depth = plain_logits(gemma, ids), build_tree_buffers(PARENTS).depth
    assert (tree_logits(gemma, ids) - plain).abs().max() < 1e-4
    twin = (tree_logits(gemma, ids, without_node_window) - plain).abs().amax(-1)  # [n+1]
    # the twin is off exactly past the window
    assert twin[depth < 8].max() < 1e-4 and twin[depth >= 8].max() > 1e-2


class OracleTree(Proposer):
    """Drafts the target's greedy continuation as a chain of DEPTH plus a wrong sibling at depth 2 (a
    tree)."""

    def __init__(self, reference, prompt_len):
        self.reference, self.prompt_len = reference, prompt_len

    def propose(self, context, sampling, generator) -> Draft:
        chain = self.reference[len(context) - self.prompt_len:][:DEPTH]
        if len(chain) < 2:
            return Draft(tokens=chain, parents=list(range(-1, len(chain) - 1)))
        return Draft(tokens=chain + [(chain[1] + 1) % 259], parents=list(range(-1, len(chain) - 1)) + [0])


@pytest.mark.parametrize("twin", [False, True])
def test_deep_tree_decoding_equals_the_target(gemma, twin, monkeypatch):
    """Greedy decoding accepting 11-deep paths equals the target's own output; with the twin's mask it does
    not."""
    target = Target(gemma, tokenizer=None, name="tiny-gemma3")
    if twin:
        monkeypatch.setattr(decoder_module, "tree_mask", without_node_window)
    outs = []
    for seed in range(3):
        prompt = torch.randint(3, 259, (PREFIX,), generator=torch.Generator().manual_seed(seed)).tolist()
        reference = hf_generate(target, prompt, 36)[0]
        out = SpeculativeDecoder(target, OracleTree(reference, len(prompt))).generate(prompt, 36)
        assert twin or max(out.accepted_drafts) >= 9  # deep paths really verified
        outs.append(out.output_ids == reference)
    assert all(outs) != twin


def draft_lm_chain(model, prompt) -> list[int]:
    """The rank-0 path of a draft LM tree of depth DEPTH (with two siblings, so it is drafted as a tree)."""
    paths = [[0] * d for d in range(1, DEPTH + 1)] + [[1], [0, 1]]
    proposer = DraftModelProposer(model, paths)
    draft = proposer.propose(prompt, decoder_module.SamplingConfig(), None)
    node, chain = -1, []
    while True:  # follow the rank-0 child from the root down
        kids = [i for i, p in enumerate(draft.parents) if p == node and proposer.ranks[i] == 0]
        if not kids:
            return chain
        node = kids[0]
        chain.append(draft.tokens[node])


@pytest.mark.parametrize("twin", [False, True])
def test_a_draft_lm_tree_past_the_window_drafts_its_greedy_path(gemma, twin, monkeypatch):
    """The draft LM's own tree forwards (one level at a time) honour the window too: the rank-0 path of its
    11-deep tree is the drafter's greedy continuation; with the twin's mask it is not."""
    from draftsmith.heads.draft_lm import proposer as draft_model

    if twin:
        monkeypatch.setattr(draft_model, "tree_mask", without_node_window)
    target, same = Target(gemma, tokenizer=None, name="g"), []
    for seed in range(4):
        prompt = torch.randint(3, 259, (PREFIX,), generator=torch.Generator().manual_seed(seed)).tolist()
        same.append(draft_lm_chain(gemma, prompt) == hf_generate(target, prompt, DEPTH)[0])
    assert all(same) != twin
