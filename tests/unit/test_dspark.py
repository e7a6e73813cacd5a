"""The `dspark` kind (heads/dspark/): the Markov head makes drafting sequential (slot i's logits carry the
bias of the token drafted at slot i-1, teacher-forced in training: the training slot equals the draft), the
confidence head's target and its stop rule, the mask slots on the vocabulary's row, the `dspark` export read
back as the same drafter (what vLLM 0.32.0 and llama.cpp b11434 read: heads/dspark/export.py) with its
refusals, and greedy decoding equal to the target's in fp32 (full and reduced vocabulary, with and without the
confidence stop).
Exact sampling at depth: tests/unit/test_exact_enumeration.py ("dspark ...")."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import build_tiny_model, build_tiny_model_dir, features_of, prompts

from draftsmith.distill.loading import load_target
from draftsmith.eval.decode.decoder import SpeculativeDecoder, hf_generate
from draftsmith.eval.serving import build_proposer
from draftsmith.heads.dspark.proposer import DSparkProposer
from draftsmith.heads.export import export_drafter
from draftsmith.heads.files import target_signature
from draftsmith.heads.folder import read_folder
from draftsmith.heads.registry import DrafterConfig, build_drafter
from draftsmith.heads.runtime.verify import SamplingConfig

N, V = 6, 259
pytestmark = pytest.mark.usefixtures("one_thread")


def drafter_for(target, seed: int = 0, draft_vocab: int = 0, **own):
    cfg = DrafterConfig.for_kind("dspark", num_speculative_tokens=3, draft_vocab=draft_vocab, markov_rank=16,
                                 **own)
    torch.manual_seed(seed)
    drafter = build_drafter(cfg, target, torch.arange(V).flip(0))
    with torch.no_grad():  # away from the initialisation (the Markov head starts near zero)
        for p in drafter.parameters():
            if p.requires_grad:
                p.add_(0.3 * torch.randn_like(p))
    return drafter.eval()


@pytest.fixture(scope="module")
def target():
    return build_tiny_model("llama", layers=N)


def block_outputs(drafter, feats, ids, p, K):
    """The block's mask-slot outputs `[K, H]` at root position p (context = positions < p)."""
    context = drafter.fuse({k: v[:, :p] for k, v in feats.items()})
    kv = drafter.context_kv(context, torch.arange(p)[None])
    block = torch.tensor([[ids[0, p].item()] + [drafter.mask_token_id] * K])
    mask = torch.ones(1, 1, K + 1, p + K + 1, dtype=torch.bool)
    return drafter.block(block, torch.arange(p, p + K + 1)[None], kv, mask)[0, 1:]


@pytest.mark.parametrize("draft_vocab", [0, 64])
def test_drafting_is_sequential_and_the_training_slot_is_the_draft(target, draft_vocab):
    drafter = drafter_for(target, draft_vocab=draft_vocab)
    ids = torch.randint(3, V, (1, 14), generator=torch.Generator().manual_seed(4))
    feats, _ = features_of(target, drafter, ids)
    proposer = DSparkProposer(drafter, 3)
    proposer.begin(ids[0, :8].tolist(), {k: v[0, :8] for k, v in feats.items()})
    draft = proposer.propose(ids[0, :9].tolist(), SamplingConfig(), None)
    with torch.no_grad():
        out = block_outputs(drafter, feats, ids, 8, 3)
        prev, expected = ids[0, 8].item(), []
        for i in range(3):  # slot i: its base logits + W2 W1[the token drafted before it]
            logits = drafter.slot_logits(out[i:i + 1], torch.tensor([prev]))[0]
            prev = int(drafter.draft_to_target(logits.argmax()))
            expected.append(prev)
        base = drafter.draft_to_target(drafter.logits(out).argmax(-1)).tolist()
    assert draft.tokens == expected and draft.parents == [-1, 0, 1]
    assert base != expected  # the Markov head changes the draft (DFlash's argmax per slot differs here)
    # training: slot i's logits are the same function of the block output and the token before it (the label)
    mask = torch.zeros_like(ids)
    mask[0, 9:12] = 1  # x_9..x_11: the three slots of the anchor at 8
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": mask, "features": feats}
    drafter.anchors = 1
    loss, metrics = drafter.compute_loss(batch)
    with torch.no_grad():
        teacher = [ids[0, 8].item(), ids[0, 9].item(), ids[0, 10].item()]
        rows = drafter.slot_logits(out, torch.tensor(teacher))
        labels = drafter.target_to_draft(ids[0, 9:12])
    inside = [i for i in range(3) if labels[i] >= 0]  # a label outside a reduced vocabulary is not trained on
    assert inside and all(metrics[f"loss/slot{i + 1}"] == pytest.approx(
        torch.nn.functional.cross_entropy(rows[i:i + 1], labels[i:i + 1]).item(), abs=1e-4) for i in inside)
    assert {"conf_bce/slot1", "conf_mae/slot1", "accept_est/slot1"} <= set(metrics) and loss.item() > 0


def test_the_confidence_target_is_the_analytical_acceptance(target):
    drafter = drafter_for(target)
    ids = torch.randint(3, V, (1, 12), generator=torch.Generator().manual_seed(5))
    feats, logits = features_of(target, drafter, ids)
    mask = torch.zeros_like(ids)
    mask[0, 8] = 1  # one slot: the anchor at 7, x_8
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": mask, "features": feats,
             "target_logits": logits.detach()}
    drafter.anchors, drafter.confidence_weight = 1, 1.0
    _, metrics = drafter.compute_loss(batch)
    with torch.no_grad():
        out = block_outputs(drafter, feats, ids, 7, 3)[:1]
        q = drafter.slot_logits(out, ids[0, 7:8]).softmax(-1)[0]
        p = logits[0, 7].softmax(-1)
        accept = torch.minimum(q, p).sum().item()  # 1 - TV(q, p)
        c = drafter.confidence(out, ids[0, 7:8]).item()
    assert metrics["accept_est/slot1"] == pytest.approx(accept, abs=1e-5)
    bce = -(accept * torch.log(torch.tensor(c)) + (1 - accept) * torch.log(torch.tensor(1 - c))).item()
    assert metrics["conf_bce/slot1"] == pytest.approx(bce, abs=1e-4)


def test_the_confidence_stop_is_llamacpps(target):
    """A slot is drafted only while its own confidence (from its output and the token before it) is at least
    the threshold: the chain is the prefix before the first slot below it."""
    drafter = drafter_for(target)
    ids = torch.randint(3, V, (1, 12), generator=torch.Generator().manual_seed(6))
    feats, _ = features_of(target, drafter, ids)
    full = DSparkProposer(drafter, 3)
    full.begin(ids[0, :8].tolist(), {k: v[0, :8] for k, v in feats.items()})
    tokens = full.propose(ids[0, :9].tolist(), SamplingConfig(), None).tokens
    with torch.no_grad():
        out = block_outputs(drafter, feats, ids, 8, 3)
        conf = [drafter.confidence(out[i:i + 1], torch.tensor([prev])).item()
                for i, prev in enumerate([ids[0, 8].item(), *tokens[:2]])]
    for threshold in sorted(conf):
        stop = DSparkProposer(drafter, 3, confidence_threshold=threshold + 1e-6)
        stop.begin(ids[0, :8].tolist(), {k: v[0, :8] for k, v in feats.items()})
        keep = next((i for i, c in enumerate(conf) if c < threshold + 1e-6), 3)
        assert stop.propose(ids[0, :9].tolist(), SamplingConfig(), None).tokens == tokens[:keep]


def test_the_mask_slots_read_the_vocabulary_row_which_is_never_saved(target, tmp_path):
    drafter = drafter_for(target)
    assert torch.equal(drafter.embed(torch.tensor([drafter.mask_token_id]))[0],
                       target.get_input_embeddings().weight[drafter.mask_token_id])
    assert "mask_embedding" not in drafter.trained_state()
    assert not any(n == "mask_embedding" for n, _ in drafter.named_parameters())


@pytest.mark.parametrize("draft_vocab", [0, 64])
def test_the_export_reads_back_as_the_drafter(target, tmp_path, draft_vocab):
    drafter = drafter_for(target, draft_vocab=draft_vocab, aux_layers=[1, 3, 4])
    folder = read_folder(drafter.save_pretrained(tmp_path / "drafter", target="tiny"))
    out = export_drafter(folder, "dspark", tmp_path / "dspark", base_model="org/tiny", dtype="float32",
                         target_model=target)
    config = json.loads((out / "config.json").read_text())
    assert (config["speculators_model_type"] == "dspark" and config["architectures"] == ["Qwen3DSparkModel"]
            and config["sample_from_anchor"] is False and config["block_size"] == 4
            and config["markov_rank"] == 16 and config["enable_confidence_head"]
            and config["aux_hidden_state_layer_ids"] == [1, 3, 4] and "model_type" not in config)
    assert not (out / "mask_embedding.pt").exists()
    back = read_folder(out).load(target)
    ours, theirs = drafter.state_dict(), back.state_dict()
    assert set(ours) == set(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)
    # what a reader of another convention would compute is refused by name
    for key, value, words in [("sample_from_anchor", True, "sample_from_anchor"),
                              ("markov_head_type", "gated", "markov_head_type"),
                              ("confidence_head_with_markov", False, "without the Markov")]:
        bad = dict(config, **{key: value})
        (out / "config.json").write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=words):
            read_folder(out).load(target)
    (out / "config.json").write_text(json.dumps(config))


def test_dspark_settings_are_checked():
    with pytest.raises(ValueError, match="markov_rank"):
        DrafterConfig.for_kind("dspark", markov_rank=0)


@pytest.mark.parametrize("draft_vocab,threshold", [(0, 0.0), (64, 0.0), (0, 0.5)])
def test_greedy_decoding_equals_the_target_fp32(tmp_path, draft_vocab, threshold):
    live = load_target(str(build_tiny_model_dir(tmp_path, "llama", layers=N)), dtype="float32", device="cpu")
    drafter = drafter_for(live.model, draft_vocab=draft_vocab)
    path = drafter.save_pretrained(tmp_path / "drafter", target=live.name, tokenizer=live.tokenizer,
                                   signature=target_signature(live.model, live.tokenizer))
    proposer = build_proposer(DrafterConfig.for_kind("dspark", num_speculative_tokens=3, path=str(path),
                                                     confidence_threshold=threshold), live)
    assert isinstance(proposer, DSparkProposer) and proposer.threshold == threshold
    decoder = SpeculativeDecoder(live, proposer)
    for prompt in prompts(3, seed=4):
        assert decoder.generate(prompt, 20).output_ids == hf_generate(live, prompt, 20)[0]
