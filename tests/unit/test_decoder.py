"""The tree-verification decoder end to end on tiny random targets (CPU, seconds).

Greedy speculative output must equal HF `generate` token for token for every proposer, trained or
not; stub proposers that always / never / partly match give exactly known accept lengths; EOS and
max_new_tokens falling inside a draft are cut exactly where plain decoding stops.
"""

from __future__ import annotations

import pytest
from helpers import OracleProposer, build_tiny_model, build_tiny_model_dir, prompts, proposers_for

from draftsmith.distill.loading import load_target
from draftsmith.distill.target import Target
from draftsmith.eval.decode.decoder import SpeculativeDecoder, hf_generate
from draftsmith.eval.serving import build_proposer
from draftsmith.heads.draft_lm.proposer import DraftModelProposer
from draftsmith.heads.prompt_lookup.proposer import PromptLookupProposer
from draftsmith.heads.registry import DrafterConfig
from draftsmith.heads.runtime.tree import load_tree, topk_chain_paths


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def target(request, tmp_path_factory) -> Target:
    folder = build_tiny_model_dir(tmp_path_factory.mktemp("dec"), request.param, layers=3)
    return load_target(str(folder), dtype="float32", device="cpu")


def test_greedy_equals_hf_generate_for_every_proposer(target, tmp_path_factory):
    for name, proposer in proposers_for(target, tmp_path_factory).items():
        decoder = SpeculativeDecoder(target, proposer)
        for i, prompt in enumerate(prompts(4, seed=hash(name) % 1000)):
            max_new = [1, 7, 20, 33][i]
            ours = decoder.generate(prompt, max_new)
            ref, _ = hf_generate(target, prompt, max_new)
            assert ours.output_ids == ref, f"{name}: prompt {i} differs from HF generate"
            assert sum(ours.accept_lengths) + 1 == ours.new_tokens


def test_autoregressive_baseline_equals_hf_generate(target):
    base = SpeculativeDecoder(target)
    for prompt in prompts(3, seed=1):
        ours = base.generate(prompt, 25)
        assert ours.output_ids == hf_generate(target, prompt, 25)[0]
        assert set(ours.accept_lengths) <= {1} and ours.tau == 1.0


def test_stub_always_never_partly_accept(target):
    prompt = prompts(1, seed=3)[0]
    ref = hf_generate(target, prompt, 40)[0]
    if len(ref) < 40:
        pytest.skip("tiny model emitted EOS early for this prompt")
    # always: every step accepts all 4 drafted tokens + bonus
    dec = SpeculativeDecoder(target, OracleProposer(ref, len(prompt), k=4))
    out = dec.generate(prompt, 31)  # 1 (prefill) + 6 steps x 5
    assert out.output_ids == ref[:31] and out.accept_lengths == [5] * 6
    # never: the draft is always wrong -> plain decoding, one token per step
    dec = SpeculativeDecoder(target, OracleProposer(ref, len(prompt), k=4, wrong_from=0))
    out = dec.generate(prompt, 12)
    assert out.output_ids == ref[:12] and out.accept_lengths == [1] * 11 and out.accepted_drafts == [0] * 11
    # partly: the first 2 of 4 are right -> 2 accepted + bonus every step
    dec = SpeculativeDecoder(target, OracleProposer(ref, len(prompt), k=4, wrong_from=2))
    out = dec.generate(prompt, 19)
    assert out.output_ids == ref[:19] and out.accept_lengths == [3] * 6


def test_eos_and_max_new_tokens_inside_a_draft(target):
    prompt = prompts(1, seed=5)[0]
    free = hf_generate(target, prompt, 30, eos_token_id=[999_999])[0]  # no EOS: the raw greedy stream
    stop = free[6]  # make a token that first appears mid-stream the end-of-sequence token
    first = free.index(stop)
    dec = SpeculativeDecoder(target, OracleProposer(free, len(prompt), k=5))
    dec.eos = {stop}
    out = dec.generate(prompt, 30)
    assert out.output_ids == free[: first + 1]
    assert out.output_ids == hf_generate(target, prompt, 30, eos_token_id=[stop])[0]
    dec.eos = {999_999}
    for max_new in (2, 4, 9):  # 1 + 5+1 = 7: 9 cuts the second step, 4 the first
        out = dec.generate(prompt, max_new)
        assert out.output_ids == free[:max_new]


def test_prompt_lookup_copies_the_latest_match():
    p = PromptLookupProposer(num_tokens=3, ngram_max=2, ngram_min=1)
    draft = p.propose([5, 6, 7, 8, 9, 1, 5, 6, 4, 4, 5, 6], None, None)
    assert draft.tokens == [4, 4, 5] and draft.parents == [-1, 0, 1]  # "5 6" last seen before "4 4 5"
    assert p.propose([1, 2, 3], None, None).n == 0


def test_prompt_lookup_trie_drafts_several_matches():
    context = [5, 6, 7, 8, 9, 1, 5, 6, 4, 4, 5, 6, 7, 2, 5, 6]
    one = PromptLookupProposer(num_tokens=3, ngram_max=2, ngram_min=1)
    trie = PromptLookupProposer(num_tokens=3, ngram_max=2, ngram_min=1, matches=3)
    assert one.propose(context, None, None).tokens == [7, 2, 5]  # one match: the latest, as before
    assert trie.continuations(context) == [[7, 2, 5], [4, 4, 5], [7, 8, 9]]  # "5 6", latest first
    draft = trie.propose(context, None, None)
    # "7" shared by the first and third continuation: a trie, siblings distinct
    assert draft.tokens == [7, 2, 5, 4, 4, 5, 8, 9] and draft.parents == [-1, 0, 1, -1, 3, 4, 0, 6]
    # a continuation that is a prefix of one already found adds no node and does not count as a match
    assert PromptLookupProposer(2, 1, 1, matches=2).continuations([3, 4, 9, 3, 4, 9, 3]) == [[4, 9]]
    assert trie.tree == "lookup trie, 3 matches x 3" and trie.branch_label == "lookup-3x3"
    with pytest.raises(ValueError, match="lookup_matches must be >= 1"):
        PromptLookupProposer(3, 2, 1, matches=0)


def test_draft_lm_tree_shapes(target):
    model = build_tiny_model("llama", layers=1, seed=3)
    proposer = DraftModelProposer(model, topk_chain_paths(3, 2))
    draft = proposer.propose(prompts(1, seed=9)[0], None, None)
    assert draft.parents == [-1, -1, -1, 0, 1, 2] and draft.n == 6
    assert len(set(draft.tokens[:3])) == 3  # distinct top-3 at the root
    medusa = DraftModelProposer(model, load_tree("medusa-k4-default"))
    assert medusa.propose(prompts(1, seed=9)[0], None, None).n == len(load_tree("medusa-k4-default"))


def test_drafter_with_other_vocabulary_is_refused(target, tmp_path):
    other = build_tiny_model("llama", layers=1, vocab_size=300)
    other.save_pretrained(tmp_path / "other")
    with pytest.raises(ValueError, match="vocabulary size 300 differs from the target's 259"):
        build_proposer(DrafterConfig(kind="draft-lm", path=str(tmp_path / "other")), target)


def test_drafter_with_other_tokenizer_is_refused(target, tmp_path):
    from helpers import build_tiny_tokenizer

    folder = build_tiny_model_dir(tmp_path, "llama", layers=1)
    tok = build_tiny_tokenizer()
    vocab = tok.get_vocab()
    a, b = sorted(vocab)[10], sorted(vocab)[11]  # swap two ids: same size, different tokens
    backend = tok.backend_tokenizer
    import json

    state = json.loads(backend.to_str())
    state["model"]["vocab"][a], state["model"]["vocab"][b] = vocab[b], vocab[a]
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    swapped = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(state)),
                                      eos_token="<|im_end|>", pad_token="<|im_end|>")
    swapped.save_pretrained(folder)
    with pytest.raises(ValueError, match="tokenizer differs from the target's"):
        build_proposer(DrafterConfig(kind="draft-lm", path=str(folder)), target)


def test_sliding_window_target_stays_lossless_past_its_window(tmp_path_factory):
    """Gemma 3 (a sliding window of 8 here) with chains and trees over contexts several windows long: the
    decoder keeps every position in plain cache layers and puts the window in the tree masks."""
    from helpers import randomised

    from draftsmith.heads.eagle.proposer import EagleProposer
    from draftsmith.heads.runtime.tree import ServingTree

    folder = build_tiny_model_dir(tmp_path_factory.mktemp("gemma"), "gemma3", layers=6)
    target = load_target(str(folder), dtype="float32", device="cpu")
    assert target.config.sliding_window == 8
    named = proposers_for(target, tmp_path_factory)
    chosen = {k: named[k]
              for k in ("prompt-lookup", "layer-skip-topk", "medusa-untrained-tree", "draft-lm-tree")}
    chosen["eagle3-dynamic"] = EagleProposer(randomised("eagle3", target),
                                             ServingTree(topk=3, depth=3, budget=6))
    for name, proposer in chosen.items():
        decoder = SpeculativeDecoder(target, proposer)
        for i, prompt in enumerate(prompts(2, seed=4)):
            prompt = (prompt * 3)[:30]  # past the window before decoding starts
            assert decoder.generate(prompt, 40).output_ids == hf_generate(target, prompt, 40)[0], (name, i)
    with pytest.raises(ValueError, match="sliding-window layers.*batch size 1"):
        SpeculativeDecoder(target).generate_batch(prompts(2, seed=1), 4)


def test_sliding_window_negative_twin(tmp_path_factory, monkeypatch):
    """The tree masks without their window: outputs diverge from the target's past the window."""
    from helpers import randomised

    from draftsmith.eval.decode import decoder as decoder_module
    from draftsmith.heads.eagle.proposer import EagleProposer
    from draftsmith.heads.runtime.tree import ServingTree

    folder = build_tiny_model_dir(tmp_path_factory.mktemp("gemma-twin"), "gemma3", layers=6)
    target = load_target(str(folder), dtype="float32", device="cpu")
    real = decoder_module.tree_mask
    monkeypatch.setattr(decoder_module, "tree_mask", lambda *a: real(*a)["full_attention"])
    decoder = SpeculativeDecoder(target, EagleProposer(randomised("eagle3", target),
                                                       ServingTree(topk=3, depth=3, budget=6)))
    runs = [(p * 3)[:30] for p in prompts(4, seed=4)]
    assert any(decoder.generate(p, 40).output_ids != hf_generate(target, p, 40)[0] for p in runs)


def test_each_step_records_where_its_time_went(target, tmp_path_factory):
    """BatchResult.phase_seconds splits the steps' time into drafting, the target's verification forward and
    the acceptance rule + cache upkeep: a drafter's cost per step is measured, not inferred. The prefill is
    the rest. A proposer that sleeps 3 ms in every propose shows the drafting is charged to "draft" (a floor,
    not a speed)."""
    import time

    from draftsmith.heads.runtime.proposer import Draft, Proposer

    class Slow(Proposer):
        def propose(self, context, sampling, generator):
            time.sleep(0.003)
            return Draft(tokens=[], parents=[])

    for decoder in (SpeculativeDecoder(target), SpeculativeDecoder(target, Slow())):
        out = decoder.generate_batch(prompts(2, seed=5), 12)
        assert set(out.phase_seconds) == {"draft", "verify", "accept"} and out.steps > 0
        assert all(v >= 0 for v in out.phase_seconds.values()) and out.phase_seconds["verify"] > 0
        assert sum(out.phase_seconds.values()) <= out.wall_time
    # two live rows, each slept in every step's propose
    assert out.phase_seconds["draft"] >= 2 * 0.003 * out.steps
    one = SpeculativeDecoder(target, Slow()).generate(prompts(1, seed=6)[0], 6)
    assert one.phase_seconds["draft"] >= 0.003 * len(one.accept_lengths)  # generate() keeps its batch's split
