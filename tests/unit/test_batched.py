"""Speculative decoding of batches (eval/decode/decoder.py `generate_batch`) on tiny random targets (CPU,
fp32, seconds).

Greedy: every sequence of a batch equals HF `generate` on that prompt alone, for every proposer
(prompt lookup, draft-LM chains and trees, layer-skip, untrained Medusa and EAGLE chains), at batch
sizes 1, 3 and 4, with prompts of different lengths; stub proposers give each sequence of one batch
its own exactly known accept lengths; EOS inside one sequence's draft ends it while the others go
on; the batch path at batch 1 (holes, no compaction) equals the one-sequence path (compaction) token for
token (greedy and sampled); the cache repack keeps
outputs; and batched speculative sampling at T=1 follows the target's distribution (chi-square).
"""

from __future__ import annotations

import pytest
import torch
from helpers import (
    OracleProposer,
    build_tiny_model_dir,
    prompts,
    proposers_for,
    randomised,
)

from draftsmith.distill.loading import load_target
from draftsmith.distill.target import Target
from draftsmith.eval.decode import decoder as decoder_module
from draftsmith.eval.decode.decoder import SpeculativeDecoder, hf_generate
from draftsmith.eval.serving import build_proposer
from draftsmith.heads.eagle.proposer import EagleProposer
from draftsmith.heads.registry import DrafterConfig
from draftsmith.heads.runtime.kv_cache import repack_cache
from draftsmith.heads.runtime.tree import ServingTree
from draftsmith.heads.runtime.verify import SamplingConfig

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models run fastest on one thread


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def target(request, tmp_path_factory) -> Target:
    folder = build_tiny_model_dir(tmp_path_factory.mktemp("batched"), request.param, layers=4)
    return load_target(str(folder), dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def all_proposers(target, tmp_path_factory) -> dict:
    out = proposers_for(target, tmp_path_factory)
    for kind in ("eagle", "eagle3"):  # untrained EAGLE chains: read per-sequence target features
        out[f"{kind}-untrained-chain"] = EagleProposer(randomised(kind, target),
                                                       ServingTree(topk=1, depth=3, budget=3))
    folder = target.model.name_or_path  # the target drafting for itself: long, different accept lengths
    out["draft-lm-self"] = build_proposer(DrafterConfig(kind="draft-lm", path=folder,
                                                        num_speculative_tokens=4), target)
    return out


@pytest.mark.parametrize("batch", [1, 3, 4])
def test_batched_greedy_equals_hf_per_sequence(target, all_proposers, batch):
    batch_prompts = prompts(4, seed=batch)[:batch]  # lengths 4..40: left padding differs per row
    refs = [hf_generate(target, p, 20)[0] for p in batch_prompts]
    for name, proposer in all_proposers.items():
        out = SpeculativeDecoder(target, proposer).generate_batch(batch_prompts, 20)
        assert [r.output_ids for r in out.results] == refs, name
        assert all(sum(r.accept_lengths) + 1 == r.new_tokens for r in out.results), name
    plain = SpeculativeDecoder(target).generate_batch(batch_prompts, 20)  # k = 0: the baseline
    assert [r.output_ids for r in plain.results] == refs and plain.tau == 1.0


def test_each_sequence_accepts_its_own_count(target):
    batch_prompts = prompts(3, seed=3)
    refs = [hf_generate(target, p, 40, eos_token_id=[999_999])[0] for p in batch_prompts]
    stubs = [OracleProposer(refs[0], len(batch_prompts[0]), k=4),  # always: 4 drafts + bonus
             OracleProposer(refs[1], len(batch_prompts[1]), k=4, wrong_from=0),  # never
             OracleProposer(refs[2], len(batch_prompts[2]), k=3, wrong_from=2)]  # first 2 of 3
    decoder = SpeculativeDecoder(target, stubs)
    decoder.eos = {999_999}
    out = decoder.generate_batch(batch_prompts, 31)
    assert [r.output_ids for r in out.results] == [ref[:31] for ref in refs]
    assert out.results[0].accept_lengths == [5] * 6
    assert out.results[1].accept_lengths == [1] * 30 and out.results[1].accepted_drafts == [0] * 30
    assert out.results[2].accept_lengths == [3] * 10
    assert out.steps == 30  # finished rows stay in the batch until the slowest one ends


def test_eos_mid_batch(target):
    batch_prompts = prompts(3, seed=5)
    free = [hf_generate(target, p, 30, eos_token_id=[999_999])[0] for p in batch_prompts]
    stop = free[0][6]  # a token of sequence 0's stream becomes EOS: it ends there, mid-draft
    decoder = SpeculativeDecoder(target,
                                 [OracleProposer(f, len(p), k=5) for f, p in zip(free, batch_prompts)])
    decoder.eos = {stop}
    out = decoder.generate_batch(batch_prompts, 30)
    refs = [hf_generate(target, p, 30, eos_token_id=[stop])[0] for p in batch_prompts]
    assert [r.output_ids for r in out.results] == refs
    assert out.results[0].output_ids[-1] == stop and len(refs[0]) <= 7 < max(map(len, refs))


def test_batch_one_equals_speculative_decoder(target, all_proposers):
    """At batch 1 the batch path (holes, repack, masks) and the one-sequence path (compaction, mask-free
    chains) give the same tokens from the same random draws."""
    sampling = SamplingConfig(temperature=1.0)
    for name in ("layer-skip-topk", "medusa-untrained-tree", "draft-lm-chain", "eagle-untrained-chain"):
        proposer = all_proposers[name]
        for i, prompt in enumerate(prompts(3, seed=8)):
            for cfg in (SamplingConfig(), sampling):
                ref = SpeculativeDecoder(target, proposer).generate(prompt, 25, cfg,
                                                                    torch.Generator().manual_seed(i))
                ours = SpeculativeDecoder(target, proposer, compact=False).generate_batch(
                    [prompt], 25, cfg, torch.Generator().manual_seed(i)).results[0]
                assert ((ours.output_ids, ours.accept_lengths) == (ref.output_ids,
                                                                   ref.accept_lengths)), (name, cfg)


def test_repack_keeps_each_rows_valid_slots_in_order():
    from transformers import DynamicCache

    cache = DynamicCache()
    keys = torch.arange(2 * 6, dtype=torch.float32).reshape(2, 1, 6, 1)  # [B=2, H=1, L=6, D=1]
    cache.update(keys, keys + 100, 0)
    valid = torch.tensor([[0, 1, 1, 0, 1, 0], [1, 1, 0, 1, 0, 1]], dtype=torch.bool)
    new_valid = repack_cache(cache, valid)
    assert new_valid.tolist() == [[False, True, True, True], [True, True, True, True]]
    assert cache.layers[0].keys[:, 0, :, 0].tolist()[0][1:] == [1, 2, 4]
    assert cache.layers[0].keys[:, 0, :, 0].tolist()[1] == [6, 7, 9, 11]
    assert torch.equal(cache.layers[0].values, cache.layers[0].keys + 100)


def test_repacked_generation_is_unchanged(target, all_proposers, monkeypatch):
    calls = []

    def counting(cache, valid):
        calls.append(valid.shape[1])
        return repack_cache(cache, valid)

    monkeypatch.setattr(decoder_module, "repack_cache", counting)
    batch_prompts = prompts(3, seed=11)
    out = SpeculativeDecoder(target, all_proposers["draft-lm-tree"]).generate_batch(batch_prompts, 40)
    assert calls, "rejected tree nodes must have triggered a repack"
    assert [r.output_ids for r in out.results] == [hf_generate(target, p, 40)[0] for p in batch_prompts]


# Batched sampling at T > 0 against the exact law: tests/unit/test_sampling.py.
