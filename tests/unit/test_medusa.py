"""Medusa heads: shapes, unshared layers, exact init from the target, loss properties and alignment,
sparse vs dense distillation, a short fit, save/load round trip, and the registry around them."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import build_tiny_model

from draftsmith.heads.folder import read_folder
from draftsmith.heads.losses import TOKEN_LOSSES, token_loss
from draftsmith.heads.medusa.model import MedusaHeads
from draftsmith.heads.registry import DrafterConfig, build_drafter, trainable_kinds

H, V = 32, 259


def make_batch(B=2, T=12, hidden=H, vocab=V, seed=0, logits=True):
    """Random batch: a 3-token prompt (loss_mask 0), right padding of 2 in the second row."""
    g = torch.Generator().manual_seed(seed)
    attention = torch.ones(B, T, dtype=torch.long)
    attention[1, -2:] = 0
    loss_mask = attention.clone()
    loss_mask[:, :3] = 0
    batch = {"input_ids": torch.randint(0, vocab, (B, T), generator=g), "loss_mask": loss_mask,
             "attention_mask": attention, "features": {"final": torch.randn(B, T, hidden, generator=g)}}
    if logits:
        batch["target_logits"] = 3 * torch.randn(B, T, vocab, generator=g)
    return batch


def test_shapes():
    heads = MedusaHeads(H, V, num_heads=3, num_layers=2)
    assert heads(torch.randn(2, 5, H)).shape == (3, 2, 5, V)
    keys = set(heads.state_dict())
    assert {"heads.2.0.linear.weight", "heads.2.1.linear.bias", "heads.2.2.weight"} <= keys
    assert len(keys) == 3 * (2 * 2 + 1)


def test_layers_do_not_share_parameters():
    heads = MedusaHeads(H, V, num_heads=3, num_layers=2)
    linears = [m for m in heads.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 3 * 3
    ptrs = [p.data_ptr() for m in linears for p in m.parameters()]
    assert len(ptrs) == len(set(ptrs))


def test_untrained_heads_equal_target_lm_head():
    target = build_tiny_model()
    heads = MedusaHeads(target.config.hidden_size, target.config.vocab_size, num_heads=4, num_layers=2)
    heads.init_from_target(target.lm_head.weight)
    ids = torch.randint(0, V, (2, 7))
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
        logits = heads(out.hidden_states[-1])  # final-normed last hidden state
    for k in range(4):
        torch.testing.assert_close(logits[k], out.logits, rtol=0, atol=1e-5)
    assert heads.heads[0][-1].weight.data_ptr() != target.lm_head.weight.data_ptr()  # a copy
    with pytest.raises(ValueError, match=r"shape \(259, 16\)"):
        heads.init_from_target(torch.zeros(V, 16))


def test_kl_helper_zero_for_equal_and_nonnegative():
    a, b = torch.randn(50, V), torch.randn(50, V)
    assert token_loss("kl", a, a).abs().max() < 1e-5
    assert token_loss("kl", a, a, temperature=2.0).abs().max() < 1e-5
    assert (token_loss("kl", a, b) >= 0).all() and token_loss("kl", a, b).mean() > 0.1


def test_loss_zero_when_heads_match_target():
    """Constant features -> every head emits lm_head(h) everywhere; the target emits the same."""
    heads = MedusaHeads(H, V, num_heads=3)
    lm_head = torch.randn(V, H)
    heads.init_from_target(lm_head)
    batch = make_batch()
    h = torch.randn(H)
    batch["features"]["final"] = h.expand(2, 12, H).clone()
    batch["target_logits"] = (lm_head @ h).expand(2, 12, V).clone()
    loss, metrics = heads.compute_loss(batch)
    assert loss.item() < 1e-5 and all(metrics[f"loss/head{k}"] < 1e-5 for k in range(3))
    batch["target_logits"] = torch.randn(2, 12, V)
    assert heads.compute_loss(batch)[0].item() > 0.0


def test_masked_positions_are_ignored():
    heads = MedusaHeads(H, V, num_heads=3)
    torch.nn.init.normal_(heads.heads[1][0].linear.weight, std=0.1)
    for loss in ("kl", "ce"):
        heads.loss = loss
        batch = make_batch()
        ref, ref_metrics = heads.compute_loss(batch)
        assert ref.item() >= 0
        tampered = make_batch()
        label_off = (tampered["loss_mask"] * tampered["attention_mask"]) == 0  # [B, T]
        tampered["input_ids"][label_off] = 7
        # target logits at j only label token j+1; features at padding are never a source
        tampered["target_logits"][:, :-1][label_off[:, 1:]] = 5.0
        tampered["target_logits"][:, -1] = -5.0
        tampered["features"]["final"][tampered["attention_mask"] == 0] = 100.0
        out, metrics = heads.compute_loss(tampered)
        torch.testing.assert_close(out, ref)
        assert metrics == ref_metrics


def test_label_alignment_perfect_head():
    """Features encode token t+k+2 in block k; head k reads block k -> accuracy 1 exactly when aligned."""
    K, Vs, T = 3, 11, 10
    ids = torch.randint(0, Vs, (2, T), generator=torch.Generator().manual_seed(1))
    feats = torch.zeros(2, T, K * Vs)
    for k in range(K):
        for t in range(T - k - 2):
            feats[:, t, k * Vs:(k + 1) * Vs] = torch.nn.functional.one_hot(ids[:, t + k + 2], Vs).float()
    heads = MedusaHeads(K * Vs, Vs, num_heads=K, loss="ce")
    with torch.no_grad():
        for k in range(K):
            w = torch.zeros(Vs, K * Vs)
            w[:, k * Vs:(k + 1) * Vs] = 10 * torch.eye(Vs)
            heads.heads[k][-1].weight.copy_(w)
    ones = torch.ones(2, T, dtype=torch.long)
    batch = {"input_ids": ids, "loss_mask": ones, "attention_mask": ones, "features": {"final": feats}}
    _, metrics = heads.compute_loss(batch)
    for k in range(K):
        assert metrics[f"acc_top1/head{k}"] == 1.0 and metrics[f"acc_top5/head{k}"] == 1.0
    assert metrics["expected_tau"] == pytest.approx(1 + K)
    batch["input_ids"] = torch.roll(ids, 1, dims=1)  # off by one: the fit no longer lines up
    assert heads.compute_loss(batch)[1]["acc_top1/head0"] < 0.5


def test_sparse_topk_equals_dense():
    heads = MedusaHeads(H, V, num_heads=2, temperature=1.5)
    torch.nn.init.normal_(heads.heads[0][0].linear.weight, std=0.1)
    batch = make_batch()
    dense = batch.pop("target_logits")
    values, indices = dense.topk(V, dim=-1)
    sparse, _ = heads.compute_loss({**batch, "target_topk_values": values, "target_topk_indices": indices})
    full, _ = heads.compute_loss({**batch, "target_logits": dense})
    torch.testing.assert_close(sparse, full)
    # k < V: the same as dense logits with -inf outside the kept k
    values, indices = dense.topk(8, dim=-1)
    masked = torch.full_like(dense, float("-inf")).scatter(-1, indices, values)
    sparse, _ = heads.compute_loss({**batch, "target_topk_values": values, "target_topk_indices": indices})
    full, _ = heads.compute_loss({**batch, "target_logits": masked})
    torch.testing.assert_close(sparse, full)
    assert torch.isfinite(full)


def test_kl_without_logits_falls_back_to_ce():
    batch = make_batch(logits=False)
    kl_heads, ce_heads = MedusaHeads(H, V, 2, loss="kl"), MedusaHeads(H, V, 2, loss="ce")
    ce_heads.load_state_dict(kl_heads.state_dict())
    torch.testing.assert_close(kl_heads.compute_loss(batch)[0], ce_heads.compute_loss(batch)[0])


def test_decay_weights_heads():
    heads = MedusaHeads(H, V, num_heads=3, decay=0.5)
    loss, m = heads.compute_loss(make_batch())
    expected = sum(0.5**k * m[f"loss/head{k}"] for k in range(3)) / sum(0.5**k for k in range(3))
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_too_short_sequence_gives_zero_loss_with_graph():
    heads = MedusaHeads(H, V, num_heads=3)
    loss, metrics = heads.compute_loss(make_batch(T=2))
    assert loss.item() == 0.0 and loss.requires_grad and metrics["expected_tau"] == 1.0


@pytest.mark.parametrize("loss_kind", TOKEN_LOSSES)
def test_every_divergence_trains_the_heads(loss_kind):
    """Medusa takes the divergence module's every loss (the acceptance-aimed nla and lk_hybrid too): finite,
    differentiable, dense and sparse top-k."""
    heads = MedusaHeads(H, V, num_heads=2, loss=loss_kind)
    batch = make_batch()
    top = batch["target_logits"].topk(8, -1)
    sparse = dict(make_batch(logits=False), target_topk_values=top.values, target_topk_indices=top.indices)
    for b in (batch, sparse):
        loss, _ = heads.compute_loss(b)
        loss.backward()
        assert (torch.isfinite(loss)
                and all(torch.isfinite(p.grad).all() for p in heads.parameters() if p.grad is not None))
        heads.zero_grad()


@pytest.mark.parametrize("loss_kind", ["kl", "ce"])
def test_few_adam_steps_lower_the_loss(loss_kind):
    torch.manual_seed(0)
    heads = MedusaHeads(H, V, num_heads=2, loss=loss_kind)
    batch = make_batch()
    opt = torch.optim.Adam(heads.parameters(), lr=1e-2)
    losses = []
    for _ in range(15):
        loss, _ = heads.compute_loss(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]


def test_save_load_round_trip(tmp_path):
    heads = MedusaHeads(H, V, num_heads=3, num_layers=2, loss="ce", decay=0.7)
    for p in heads.parameters():
        torch.nn.init.normal_(p, std=0.05)
    heads.save_pretrained(tmp_path / "d", target="tiny/llama")
    meta = json.loads((tmp_path / "d" / "draftsmith.json").read_text())
    assert (meta == {"kind": "medusa", "target": "tiny/llama", "feature_layers": ["final"],
                     "format_version": 1})
    signature = {"vocab_size": V, "hidden_size": H, "tokenizer": "abc"}
    heads.save_pretrained(tmp_path / "s", target="tiny/llama", signature=signature)
    assert json.loads((tmp_path / "s" / "draftsmith.json").read_text())["target_signature"] == signature
    again = MedusaHeads.from_pretrained(tmp_path / "d")
    assert (again.num_layers, again.loss, again.decay) == (2, "ce", 0.7)
    x = torch.randn(2, 5, H)
    assert torch.equal(heads(x), again(x))


def test_from_pretrained_names_bad_keys(tmp_path):
    from safetensors.torch import load_file, save_file

    MedusaHeads(H, V, num_heads=2).save_pretrained(tmp_path, target="t")
    state = load_file(str(tmp_path / "model.safetensors"))
    state["heads.1.0.lin.weight"] = state.pop("heads.1.0.linear.weight")
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError,
                       match=r"missing \['heads.1.0.linear.weight'\].*unexpected \['heads.1.0.lin.weight'\]"):
        MedusaHeads.from_pretrained(tmp_path)


def test_registry_build_and_load(tmp_path):
    assert {"medusa", "draft-lm", "eagle", "eagle3"} <= set(trainable_kinds())
    target = build_tiny_model(vocab_size=V)
    lm_head = target.get_output_embeddings().weight
    cfg = DrafterConfig.for_kind("medusa", heads=3, layers=2, loss="ce", head_decay=0.5)
    drafter = build_drafter(cfg, target)
    assert (isinstance(drafter, MedusaHeads) and drafter.kind == "medusa"
            and drafter.feature_layers == ("final",))
    assert (drafter.num_heads, drafter.num_layers, drafter.loss, drafter.decay) == (3, 2, "ce", 0.5)
    assert torch.equal(drafter.heads[2][-1].weight, lm_head) and drafter.heads[2][-1].weight is not lm_head
    drafter.save_pretrained(tmp_path / "d", target="t")
    loaded = read_folder(tmp_path / "d").load()
    x = torch.randn(1, 4, drafter.hidden_size)
    assert torch.equal(loaded(x), drafter(x))


def test_registry_errors(tmp_path):
    with pytest.raises(ValueError,
                       match=r"'prompt-lookup' is not trainable; trainable kinds: draft-lm, medusa"):
        build_drafter(DrafterConfig(kind="prompt-lookup"), build_tiny_model(vocab_size=V))
    with pytest.raises(FileNotFoundError, match="draftsmith.json"):
        read_folder(tmp_path)
    (tmp_path / "draftsmith.json").write_text(json.dumps({"kind": "eagle9"}))
    with pytest.raises(ValueError, match="'eagle9'"):
        read_folder(tmp_path)


@pytest.mark.parametrize("bad, match", [
    ({"heads": 0}, "medusa.heads"), ({"layers": 0}, "medusa.layers"),
    ({"loss": "mse"}, "loss"), ({"head_decay": 0.0}, "head_decay"), ({"head_decay": 1.5}, "head_decay"),
    ({"distill_temperature": 0.0}, "distill_temperature")])
def test_drafter_config_validation(bad, match):
    with pytest.raises(ValueError, match=match):
        DrafterConfig.for_kind("medusa", **bad)
