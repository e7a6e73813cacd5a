"""CUDA tier (marked `gpu`, skipped without a device): the decoder stays lossless on the GPU.

Greedy speculative output equals HF `generate` on a tiny random Llama in fp32 on CUDA, with an
untrained Medusa tree and an untrained EAGLE-3 dynamic tree; no timings are asserted here
(scripts/gpu_check.py measures them).
"""

from __future__ import annotations

import pytest
import torch
from helpers import build_tiny_model

from draftsmith.distill.target import Target
from draftsmith.eval.decode.decoder import SpeculativeDecoder, hf_generate
from draftsmith.heads.eagle.proposer import EagleProposer
from draftsmith.heads.medusa.model import MedusaHeads
from draftsmith.heads.medusa.proposer import MedusaProposer
from draftsmith.heads.registry import DrafterConfig, build_drafter
from draftsmith.heads.runtime.tree import ServingTree, load_tree

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_greedy_lossless_on_cuda():
    model = build_tiny_model("llama", layers=3).cuda()
    target = Target(model, tokenizer=None, name="tiny-cuda")
    heads = MedusaHeads(model.config.hidden_size, model.config.vocab_size, num_heads=4)
    heads.init_from_target(model.get_output_embeddings().weight.cpu())
    eagle = build_drafter(DrafterConfig.for_kind("eagle3", aux_layers=[1, 1, 2], draft_vocab=0), model.cpu())
    model.cuda()
    proposers = [MedusaProposer(heads.cuda(), load_tree("medusa-k4-default")),
                 EagleProposer(eagle.cuda(), ServingTree(topk=3, depth=4, budget=8))]
    g = torch.Generator().manual_seed(0)
    for proposer in proposers:
        decoder = SpeculativeDecoder(target, proposer)
        for n in (5, 40):
            prompt = torch.randint(3, 259, (12,), generator=g).tolist()
            assert decoder.generate(prompt, n).output_ids == hf_generate(target, prompt, n)[0]
