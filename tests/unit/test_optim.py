"""train.optimizer (train/optim.py): Muon takes the hidden weight matrices and AdamW the rest; the composite
is one optimizer to a schedule and to a checkpoint (a resumed run takes the very step the uninterrupted one
takes); ZeRO /
FSDP are refused by name."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from helpers import build_tiny_model, features_of

from draftsmith.heads.registry import DrafterConfig, build_drafter
from draftsmith.train.optim import MuonWithAdamW, make_optimizer, muon_matrices

V = 259


@pytest.fixture(scope="module")
def target():
    return build_tiny_model("llama", layers=4)


def dspark(target):
    torch.manual_seed(0)
    cfg = DrafterConfig.for_kind("dspark", num_speculative_tokens=3, markov_rank=16, draft_vocab=64,
                                 aux_layers=[1, 2, 3])
    return build_drafter(cfg, target, torch.arange(V).flip(0))


def loss(drafter, b):
    torch.manual_seed(7)  # the training anchors are drawn at random: the same ones for every call
    return drafter.compute_loss(b)[0]


def batch(target, drafter):
    ids = torch.randint(3, V, (2, 16), generator=torch.Generator().manual_seed(1))
    feats, logits = features_of(target, drafter, ids)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids),
            "features": {k: v.detach() for k, v in feats.items()}, "target_logits": logits.detach()}


def test_muon_takes_the_hidden_matrices_and_adamw_the_rest(target):
    drafter = dspark(target)
    names = {id(p): n for n, p in drafter.named_parameters()}
    matrices, rest = muon_matrices(drafter, {V, drafter.draft_vocab_size})
    muon = {names[id(p)] for p in matrices}
    assert "fc.weight" in muon and "layers.0.self_attn.q_proj.weight" in muon and \
        "layers.0.mlp.down_proj.weight" in muon
    others = {names[id(p)] for p in rest}
    # the Markov embedding (nn.Embedding), its vocabulary head, the 1-wide confidence head, norms: AdamW
    assert {"markov_head.markov_w1.weight", "markov_head.markov_w2.weight", "confidence_head.proj.weight",
            "confidence_head.proj.bias", "norm.weight"} <= others
    assert not muon & others and len(muon) + len(others) == sum(p.requires_grad for p in drafter.parameters())


def test_the_composite_trains_follows_a_schedule_and_resumes_exactly(target):
    drafter = dspark(target)
    b = batch(target, drafter)
    cfg = SimpleNamespace(optimizer="muon", lr=2e-3, weight_decay=0.0)
    opt = make_optimizer(drafter, cfg, {V, drafter.draft_vocab_size})
    assert isinstance(opt, MuonWithAdamW)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5 ** step)
    first = loss(drafter, b).item()
    for _ in range(3):
        opt.zero_grad()
        loss(drafter, b).backward()
        opt.step()
        schedule.step()
    assert loss(drafter, b).item() < first
    assert opt.muon.param_groups[0]["lr"] == pytest.approx(2e-3 * 0.5 ** 3)  # the schedule reached Muon
    # a checkpoint: a fresh optimizer loaded from the state takes the same next step
    twin = copy.deepcopy(drafter)
    twin_opt = make_optimizer(twin, cfg, {V, twin.draft_vocab_size})
    twin_opt.load_state_dict(copy.deepcopy(opt.state_dict()))
    for model, o in ((drafter, opt), (twin, twin_opt)):
        o.zero_grad()
        loss(model, b).backward()
        o.step()
    assert all(torch.equal(p, q) for p, q in zip(drafter.parameters(), twin.parameters()))
    # the twin: without the momentum state the next step differs
    fresh = copy.deepcopy(twin)
    bare = make_optimizer(fresh, cfg, {V, fresh.draft_vocab_size})
    for g in bare.param_groups:
        g["lr"] = opt.param_groups[0]["lr"]
    bare.zero_grad()
    loss(fresh, b).backward()
    bare.step()
    twin_opt.zero_grad()
    loss(twin, b).backward()
    twin_opt.step()
    assert not all(torch.equal(p, q) for p, q in zip(fresh.parameters(), twin.parameters()))


def test_adamw_is_the_default_and_sharding_refuses_muon(target):
    drafter = dspark(target)
    assert isinstance(make_optimizer(drafter, SimpleNamespace(optimizer="adamw", lr=1e-3, weight_decay=0.0),
                                     {V}), torch.optim.AdamW)
    with pytest.raises(ValueError, match="ZeRO / FSDP.*train.optimizer=adamw"):
        make_optimizer(drafter, SimpleNamespace(optimizer="muon", lr=1e-3, weight_decay=0.0), {V},
                       sharded=True)


def test_muon_lr_gives_the_muon_group_its_own_rate_under_one_schedule(target):
    drafter = dspark(target)
    opt = make_optimizer(drafter, SimpleNamespace(optimizer="muon", lr=1e-3, weight_decay=0.0, muon_lr=1e-2),
                         {V, drafter.draft_vocab_size})
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5 ** step)
    loss(drafter, batch(target, drafter)).backward()
    opt.step()
    schedule.step()
    assert opt.muon.param_groups[0]["lr"] == pytest.approx(1e-2 * 0.5)  # its own rate, scheduled
    assert opt.adamw.param_groups[0]["lr"] == pytest.approx(1e-3 * 0.5)
    # the twin: unset, both groups share train.lr
    same = make_optimizer(drafter, SimpleNamespace(optimizer="muon", lr=1e-3, weight_decay=0.0, muon_lr=None),
                          {V, drafter.draft_vocab_size})
    assert same.muon.param_groups[0]["lr"] == same.adamw.param_groups[0]["lr"] == 1e-3
    # AdamW alone reads no muon_lr (a recipe's value stays valid under train.optimizer=adamw)
    plain = make_optimizer(drafter, SimpleNamespace(optimizer="adamw", lr=1e-3, weight_decay=0.0,
                                                    muon_lr=1e-2), {V})
    assert isinstance(plain, torch.optim.AdamW) and plain.param_groups[0]["lr"] == 1e-3
    with pytest.raises(ValueError, match="train.muon_lr=0: a learning rate is > 0"):
        make_optimizer(drafter, SimpleNamespace(optimizer="muon", lr=1e-3, weight_decay=0.0, muon_lr=0),
                       {V})
