"""Tree buffers against hand-drawn trees, path validation and tree loading (heads/runtime/tree.py)."""

import json
import re

import pytest
import torch
from helpers import leaf_paths

from draftsmith.heads.runtime import tree
from draftsmith.heads.runtime.tree import (
    build_tree_buffers,
    chain_parents,
    load_tree,
    paths_to_parents,
    position_ids,
    verification_mask,
)

TWO_LEVEL = [[0], [1], [0, 0], [0, 1], [1, 0]]


def _visible(rows: list[set[int]]) -> torch.Tensor:
    size = len(rows)
    return torch.tensor([[k in row for k in range(size)] for row in rows])


def test_chain_of_three():
    assert chain_parents(3) == [-1, 0, 1]
    assert chain_parents(0) == []
    b = build_tree_buffers(chain_parents(3))
    assert b.n == 3 and b.max_depth == 3
    assert b.parents == [-1, 0, 1]
    assert b.depth.tolist() == [0, 1, 2, 3]
    assert torch.equal(b.visible, torch.ones(4, 4, dtype=torch.bool).tril())
    assert leaf_paths(b.parents) == [[0, 1, 2, 3]]
    assert b.children == [[1], [2], [3], []]


def test_star():
    b = build_tree_buffers([-1, -1, -1])
    assert b.n == 3 and b.max_depth == 1
    assert b.depth.tolist() == [0, 1, 1, 1]
    assert torch.equal(b.visible, _visible([{0}, {0, 1}, {0, 2}, {0, 3}]))
    assert leaf_paths(b.parents) == [[0, 1], [0, 2], [0, 3]]
    assert b.children == [[1, 2, 3], [], [], []]


def test_two_levels():
    parents, ranks = paths_to_parents(TWO_LEVEL)
    assert parents == [-1, -1, 0, 0, 1]
    assert ranks == [0, 1, 0, 1, 0]
    b = build_tree_buffers(parents)
    assert b.n == 5 and b.max_depth == 2
    assert b.depth.tolist() == [0, 1, 1, 2, 2, 2]
    assert torch.equal(b.visible, _visible([{0}, {0, 1}, {0, 2}, {0, 1, 3}, {0, 1, 4}, {0, 2, 5}]))
    assert leaf_paths(b.parents) == [[0, 1, 3], [0, 1, 4], [0, 2, 5]]
    assert b.children == [[1, 2], [3, 4], [5], [], [], []]


def test_uneven_leaves_are_padded():
    b = build_tree_buffers(paths_to_parents([[0], [1], [0, 0], [0, 0, 0]])[0])
    assert leaf_paths(b.parents) == [[0, 2], [0, 1, 3, 4]]


def test_empty_tree_is_just_the_root():
    b = build_tree_buffers([])
    assert b.n == 0 and b.max_depth == 0
    assert leaf_paths(b.parents) == [[0]]
    assert b.children == [[]]


def test_paths_are_sorted_by_depth_then_path():
    shuffled = [[1, 0], [0, 1], [1], [0, 0], [0]]
    assert paths_to_parents(shuffled) == paths_to_parents(TWO_LEVEL)


@pytest.mark.parametrize(
    "paths, named",
    [
        ([[0], [1, 0]], "[1, 0]"),
        ([[0], []], "[]"),
        ([[0], [0, -1]], "[0, -1]"),
        ([[0], [1], [0]], "[0]"),
    ],
)
def test_bad_paths_raise_naming_the_path(paths, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        paths_to_parents(paths)


@pytest.mark.parametrize("parents", [[0], [-1, 1], [-1, -2], [-1, 0, 3]])
def test_bad_parents_raise(parents):
    with pytest.raises(ValueError):
        build_tree_buffers(parents)


def test_verification_mask_and_positions():
    b = build_tree_buffers(paths_to_parents(TWO_LEVEL)[0])
    mask = verification_mask(b.visible, prefix_len=3, dtype=torch.float16)
    assert mask.shape == (1, 1, 6, 9) and mask.dtype == torch.float16
    lowest = torch.finfo(torch.float16).min
    assert torch.all(mask[0, 0, :, :3] == 0)
    expected = torch.where(b.visible, 0.0, lowest).to(torch.float16)
    assert torch.equal(mask[0, 0, :, 3:], expected)
    assert position_ids(b.depth, 3).tolist() == [[3, 4, 4, 5, 5, 5]]


def test_load_chain_by_name():
    assert load_tree("chain-3") == [[0], [0, 0], [0, 0, 0]]
    with pytest.raises(ValueError):
        load_tree("chain-0")


def test_load_shipped_medusa_tree():
    paths = load_tree("medusa-k4-default")
    parents, ranks = paths_to_parents(paths)
    b = build_tree_buffers(parents)
    assert 40 <= b.n <= 60
    assert b.max_depth == 4
    assert [0] in paths and [0, 0, 0, 0] in paths


def test_load_json_file(tmp_path):
    listed = tmp_path / "listed.json"
    listed.write_text(json.dumps(TWO_LEVEL))
    keyed = tmp_path / "keyed.json"
    keyed.write_text(json.dumps({"paths": TWO_LEVEL}))
    assert load_tree(listed) == TWO_LEVEL
    assert load_tree(str(keyed)) == TWO_LEVEL
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps([[0], [2, 0]]))
    with pytest.raises(ValueError, match=r"\[2, 0\]"):
        load_tree(broken)


def test_unknown_tree_lists_available_names():
    with pytest.raises(FileNotFoundError) as info:
        load_tree("no-such-tree")
    message = str(info.value)
    assert "medusa-k4-default" in message and "chain-N" in message
    assert tree.TREES_DIR.is_dir()


def test_reach_is_the_depth_drafted_below_a_node_and_n_alpha_counts_only_real_trials():
    """An uneven tree: root -> a (leaf) and root -> b -> c -> d. A step that accepts a tried nothing at depth
    2, so n-α at depth 2 must not count it as a rejection."""
    from types import SimpleNamespace

    from draftsmith.heads.runtime.acceptance import acceptance_by_depth
    from draftsmith.heads.runtime.tree import build_tree_buffers

    buf = build_tree_buffers([-1, -1, 1, 2])  # nodes 1 = a, 2 = b, 3 = c, 4 = d
    assert [buf.reach(j) for j in range(5)] == [3, 1, 3, 3, 3]
    # step 1 accepts a (then stops at a leaf); step 2 accepts b, c and d
    result = SimpleNamespace(draft_depths=[buf.reach(1), buf.reach(4)], accepted_drafts=[1, 3],
                             accept_lengths=[2, 4])
    assert acceptance_by_depth([result]) == [1.0, 1.0, 1.0]
    old_way = SimpleNamespace(draft_depths=[buf.max_depth, buf.max_depth], accepted_drafts=[1, 3],
                              accept_lengths=[2, 4])
    assert acceptance_by_depth([old_way]) == [1.0, 0.5, 1.0]  # the leaf stop counted as a rejection
