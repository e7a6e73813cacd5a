"""EAGLE-1 and EAGLE-3 drafters on tiny Llama/Qwen2 targets: shapes and frozen shared weights, the
training-time-test unroll against sequential drafting, d2t/t2d maps, losslessness with static and
dynamic trees (untrained and briefly fitted drafters), exact sampling through a dynamic tree, export
round trips and their strict key maps, and a pipeline run through the CLI code path."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import (
    assert_follows_expected_length,
    build_tiny_model,
    build_tiny_model_dir,
    features_of,
    randomised,
)
from safetensors.torch import load_file, save_file

from draftsmith.distill.loading import load_target
from draftsmith.distill.target import Target
from draftsmith.eval.decode.decoder import SpeculativeDecoder, hf_generate
from draftsmith.eval.serving import build_proposer
from draftsmith.heads.eagle.eagle3 import draft_vocabulary
from draftsmith.heads.eagle.export import read_eagle
from draftsmith.heads.eagle.proposer import EagleProposer
from draftsmith.heads.eagle.ttt import ttt_mask
from draftsmith.heads.eagle.weights import acceptance_weights, step_masks
from draftsmith.heads.export import export_drafter
from draftsmith.heads.folder import read_folder
from draftsmith.heads.losses import TOKEN_LOSSES
from draftsmith.heads.registry import DrafterConfig, build_drafter
from draftsmith.heads.runtime.tree import ServingTree
from draftsmith.heads.runtime.verify import SamplingConfig

KINDS = ["eagle", "eagle3"]


def make(kind, family="llama", layers=6, vocab=None, seed=0, **kw):
    target = build_tiny_model(family, layers=layers)
    counts = torch.arange(259).flip(0) * 3 % 101  # arbitrary label counts
    own = dict(draft_vocab=vocab or 0, ttt_steps=3) if kind == "eagle3" else {}
    cfg = DrafterConfig.for_kind(kind, **own, **kw)
    torch.manual_seed(seed)
    return target, build_drafter(cfg, target, counts)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("kind", KINDS)
def test_shapes_and_frozen_target_weights(kind, family):
    target, d = make(kind, family, vocab=100)
    H = target.config.hidden_size
    assert d.kind == kind and d.fc.weight.shape == (H, (2 if kind == "eagle" else 3) * H)
    # entering layers 1, 3, 5 of 6 (2, 3, 3 are not distinct)
    assert d.feature_layers == (("final",) if kind == "eagle" else (0, 2, 4))
    ids = torch.randint(0, 259, (2, 12))
    feats, logits = features_of(target, d, ids)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids),
             "features": feats, "target_logits": logits}
    loss, metrics = d.compute_loss(batch)
    loss.backward()
    assert torch.isfinite(loss) and 1.0 <= metrics["expected_tau"] <= 6.0
    assert not d.embed_tokens.weight.requires_grad and d.embed_tokens.weight.grad is None
    assert torch.equal(d.embed_tokens.weight, target.get_input_embeddings().weight)
    if kind == "eagle":
        assert d.target_lm_head.weight.grad is None and not d.target_lm_head.weight.requires_grad
        assert d.logits(torch.zeros(1, H)).shape == (1, 259)
    else:
        assert d.lm_head.weight.grad is not None and d.logits(torch.zeros(1, H)).shape == (1, 100)
    assert d.fc.weight.grad is not None
    out = d.step(torch.randn(1, 5, H), ids[:1, :5], torch.arange(5)[None], ttt_mask(5, 0, "cpu"),
                 d.new_cache())
    assert out.shape == (1, 5, H)


EAGLE31 = {"fc_norm": True, "norm_output": True}


@pytest.mark.parametrize("norms", [{}, EAGLE31, {"norm_before_fc": True}],
                         ids=["eagle3", "fc_norm+norm_output",
                                                                               "norm_before_fc"])
def test_ttt_unroll_equals_sequential_drafting(norms):
    """Step j at position t == drafting j tokens ahead from the real features up to t-j, one call at a time
    (with the EAGLE-3.1 norms too: the normed output is what both carry to the next step)."""
    target, d = make("eagle3", layers=6, vocab=120, seed=3, **norms)
    d.eval()
    n, H = 9, target.config.hidden_size
    fused = torch.randn(1, n, H)
    inputs = torch.randint(0, 259, (1, n))
    with torch.no_grad():
        outs = d.unroll(fused, inputs, 4)
        for j in range(4):
            for t in range(j, n):
                cache, base = d.new_cache(), t - j
                causal = torch.ones(base + 1, base + 1, dtype=torch.bool).tril()[None, None]
                h = d.step(fused[:, :base + 1], inputs[:, :base + 1], torch.arange(base + 1)[None], causal,
                           cache)[:, -1:]
                for i in range(1, j + 1):
                    pos = base + i
                    mask = torch.ones(1, 1, 1, pos + 1, dtype=torch.bool)
                    h = d.step(h, inputs[:, pos:pos + 1], torch.tensor([[pos]]), mask, cache)
                assert torch.allclose(outs[j][0, t], h[0, 0], atol=1e-5), (j, t)


def test_draft_vocabulary_maps_are_consistent():
    counts = torch.zeros(259, dtype=torch.long)
    counts[[5, 7, 9, 200, 3]] = torch.tensor([50, 40, 40, 30, 1])
    assert draft_vocabulary(counts, 259, 4) == [5, 7, 9, 200]
    _, d = make("eagle3", vocab=64)
    draft_ids = torch.arange(d.draft_vocab_size)
    target_ids = d.draft_to_target(draft_ids)
    assert torch.all(target_ids[1:] > target_ids[:-1])  # sorted, distinct
    assert d.t2d.sum() == 64 and torch.all(d.t2d[target_ids])  # t2d marks exactly the draft vocabulary
    assert torch.equal(torch.cumsum(d.t2d.long(), 0)[target_ids] - 1, draft_ids)  # and inverts d2t
    with pytest.raises(ValueError, match="needs token counts"):
        build_drafter(DrafterConfig.for_kind("eagle3", draft_vocab=64), build_tiny_model())


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def target(request, tmp_path_factory) -> Target:
    folder = build_tiny_model_dir(tmp_path_factory.mktemp("eagle"), request.param, layers=4)
    return load_target(str(folder), dtype="float32", device="cpu")


def fitted(kind, target, steps=150):
    """A drafter fitted for a few hundred Adam steps on the target's own greedy text: drafts get accepted."""
    d = randomised(kind, target, vocab=200 if kind == "eagle3" else 0)
    g = torch.Generator().manual_seed(0)
    seqs = []
    for _ in range(8):
        prompt = torch.randint(3, 259, (6,), generator=g).tolist()
        seqs.append(prompt + hf_generate(target, prompt, 26, eos_token_id=[999_999])[0])
    ids = torch.tensor(seqs)
    feats, logits = features_of(target.model, d, ids)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids),
             "features": {k: v.detach() for k, v in feats.items()}, "target_logits": logits.detach()}
    opt = torch.optim.AdamW([p for p in d.parameters() if p.requires_grad], lr=3e-3)
    for _ in range(steps):
        loss, metrics = d.compute_loss(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return d.eval(), seqs


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_lossless_static_and_dynamic_trees(kind, target):
    d = randomised(kind, target, vocab=150 if kind == "eagle3" else 0)
    g = torch.Generator().manual_seed(4)
    shapes = [dict(paths=[[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]), dict(topk=3, depth=4, budget=7),
              dict(topk=1, depth=3, budget=3)]
    for shape in shapes:
        decoder = SpeculativeDecoder(target, EagleProposer(d, ServingTree(**shape)))
        for max_new in (1, 9, 30):
            prompt = torch.randint(3, 259, (int(torch.randint(3, 30, (1,), generator=g)),),
                                   generator=g).tolist()
            assert (decoder.generate(prompt, max_new).output_ids
                    == hf_generate(target, prompt, max_new)[0]), shape


@pytest.mark.parametrize("kind", KINDS)
def test_fitted_drafter_is_accepted_and_lossless(kind, target):
    d, seqs = fitted(kind, target)
    untrained = randomised(kind, target, vocab=200 if kind == "eagle3" else 0)
    taus = {}
    for name, drafter in (("fitted", d), ("untrained", untrained)):
        decoder = SpeculativeDecoder(target, EagleProposer(drafter, ServingTree(topk=3, depth=4, budget=8)))
        outs = [decoder.generate(s[:6], 26) for s in seqs[:4]]
        for s, out in zip(seqs[:4], outs):
            assert out.output_ids == hf_generate(target, s[:6], 26)[0]
        taus[name] = sum(sum(o.accept_lengths) for o in outs) / sum(len(o.accept_lengths) for o in outs)
    assert taus["fitted"] > 1.5 and taus["fitted"] > taus["untrained"] + 0.3, taus


def test_every_dynamic_tree_verification_sees_the_exact_target_law(monkeypatch):
    """At T = 1 the dynamic tree's candidates are deterministic (q = one-hot), so exactness rests on the
    rule (test_verify.py, with power) and on the verifier getting the target's exact law at every node
    of every tree it grew: checked against plain forwards (tests/exactness.py)."""
    import exactness

    from draftsmith.eval.decode import decoder as decoder_module

    V = 8
    model = build_tiny_model("llama", layers=3, seed=11, vocab_size=V)
    model.generation_config.eos_token_id = 99
    target = Target(model, tokenizer=None, name="tiny-v8")
    prompt = [1, 4, 1, 4, 1]
    torch.manual_seed(2)
    d = build_drafter(DrafterConfig.for_kind("eagle3", draft_vocab=0, aux_layers=[1, 1, 2]), model)
    decoder = SpeculativeDecoder(target, EagleProposer(d, ServingTree(topk=2, depth=2, budget=4)))
    g, law, checked, accepted = torch.Generator().manual_seed(1), exactness.model_law(model), 0, 0
    for _ in range(10):
        calls = exactness.record_verifications(monkeypatch, decoder_module)
        out = decoder.generate(prompt, 8, SamplingConfig(temperature=1.0), g)
        assert all(c[3] is None for c in calls)  # deterministic candidates
        checked += exactness.check_verifier_inputs(calls, prompt, out.output_ids, law)
        accepted += sum(out.accepted_drafts)
    assert checked > 100 and accepted > 3, (checked, accepted)


@pytest.mark.parametrize("kind", KINDS)
def test_export_round_trip_and_eval_loads_the_export(kind, target, tmp_path):
    d = randomised(kind, target, vocab=150 if kind == "eagle3" else 0)
    folder = d.save_pretrained(tmp_path / "drafter", target=target.name)
    assert (load_file(str(folder / "model.safetensors")).keys().isdisjoint({"embed_tokens.weight",
                                                                            "target_lm_head.weight"}))
    reloaded = read_folder(folder).load(target.model)
    out = export_drafter(read_folder(folder), kind, tmp_path / "export", base_model=target.name,
                         dtype="float32")
    config = json.loads((out / "config.json").read_text())
    tensors = load_file(str(out / "model.safetensors"))
    H = target.config.hidden_size
    if kind == "eagle":
        assert config["architectures"] == ["EagleLlamaForCausalLM"] and config["num_hidden_layers"] == 1
        assert tensors["fc.weight"].shape == (H, 2 * H) and "fc.bias" not in tensors
        assert ("layers.0.input_layernorm.weight" not in tensors
                and "layers.0.post_attention_layernorm.weight" in tensors)
        assert not any(k.startswith(("lm_head", "embed_tokens")) for k in tensors)
    else:
        assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 150
        # see heads/engines.py
        assert "target_hidden_size" not in config and tensors["fc.weight"].shape == (H, 3 * H)
        assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]  # vLLM: entering layer l
        # SGLang: output of layer l
        assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
        assert (config["norm_before_residual"] is False and config["bias"] is False
                and config["model_type"] == "llama")
        assert tensors["lm_head.weight"].shape == (150, H) and tensors["d2t"].dtype == torch.int64
        assert (tensors["t2d"].dtype == torch.bool
                and tensors["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * H)
        assert "embed_tokens.weight" not in tensors and "midlayer.hidden_norm.weight" in tensors
    back = read_folder(out).load(target.model)
    x, ids = torch.randn(1, 4, H), torch.randint(0, 259, (1, 4))
    mask = ttt_mask(4, 0, "cpu")
    with torch.no_grad():
        ref = d.logits(d.step(x, ids, torch.arange(4)[None], mask, d.new_cache()))
        for other in (reloaded, back):
            assert (torch.equal(other.logits(other.step(x, ids, torch.arange(4)[None], mask,
                                                        other.new_cache())), ref))
    proposer = build_proposer(DrafterConfig(kind=kind, path=str(out), tree="dynamic-6"), target)
    assert isinstance(proposer, EagleProposer) and proposer.tree == "dynamic-k4-d5-n6"
    prompt = [5, 6, 7, 8]
    assert (SpeculativeDecoder(target, proposer).generate(prompt, 12).output_ids
            == hf_generate(target, prompt, 12)[0])
    # a renamed tensor is named, not silently skipped
    tensors = load_file(str(out / "model.safetensors"))
    tensors["fc.weights"] = tensors.pop("fc.weight")
    save_file(tensors, str(out / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing \['fc.weight'\], extra \['fc.weights'\]"):
        read_eagle(out, kind, target.model)
    # a layer that normalises before the residual is another computation: refused by name
    if kind == "eagle3":
        (out / "config.json").write_text(json.dumps(dict(config, norm_before_residual=True)))
        with pytest.raises(ValueError, match="norm_before_residual is true; draftsmith's EAGLE-3 layer"):
            read_eagle(out, kind, target.model)


def test_export_refuses_the_wrong_kind_and_bias_is_exported_when_trained(tmp_path):
    target, d = make("eagle", fc_bias=True)
    folder = read_folder(d.save_pretrained(tmp_path / "d", target="t"))
    with pytest.raises(ValueError, match="'eagle3' is not one of a eagle drafter's; .* holds kind 'eagle'"):
        export_drafter(folder, "eagle3", tmp_path / "x", base_model="t")
    with pytest.raises(ValueError,
                       match="trained with an fc bias, which vLLM drops silently.*export eagle-sglang"):
        export_drafter(folder, "eagle", tmp_path / "e", base_model="t")
    # SGLang's EAGLE-1 fc has a bias
    out = export_drafter(folder, "eagle-sglang", tmp_path / "s", base_model="t")
    assert ("fc.bias" in load_file(str(out / "model.safetensors"))
            and not json.loads((out / "config.json").read_text())["bias"])
    _, plain = make("eagle")  # no trained bias: SGLang gets a zero one, the same function
    out = export_drafter(read_folder(plain.save_pretrained(tmp_path / "p", target="t")), "eagle-sglang",
                         tmp_path / "z")
    assert not load_file(str(out / "model.safetensors"))["fc.bias"].any()


def test_drafter_folder_records_its_dynamic_tree(target, tmp_path):
    """`eval --drafter DIR` reuses the recipe's dynamic tree (draftsmith.json "tree"); flags still override
    it."""
    cfg = DrafterConfig.for_kind("eagle3", draft_vocab=150, tree_nodes=7, tree_topk=2,
                                 num_speculative_tokens=3)
    d = build_drafter(cfg, target.model, torch.arange(259).flip(0))
    folder = d.save_pretrained(tmp_path / "drafter", target=target.name)
    assert (json.loads((folder / "draftsmith.json").read_text())["tree"] == {"topk": 2, "depth": 3,
                                                                             "budget": 7})
    proposer = build_proposer(DrafterConfig(kind="eagle3", path=str(folder)), target)
    assert proposer.tree == "dynamic-k2-d3-n7"
    assert (build_proposer(DrafterConfig(kind="eagle3", path=str(folder), tree="dynamic-5"),
                           target).tree == "dynamic-k4-d5-n5")
    assert (build_proposer(DrafterConfig(kind="eagle3", path=str(folder), tree_nodes=9),
                           target).tree == "dynamic-k4-d5-n9")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("loss", TOKEN_LOSSES)
def test_every_divergence_trains_an_eagle_drafter(kind, loss):
    """EAGLE takes the divergence module's every loss (tvd = 1 - the acceptance rate of speculative sampling),
    dense (online) and sparse top-k (offline shards), on the full and on a reduced draft vocabulary."""
    from draftsmith.heads.losses import token_loss

    for vocab in (None, 120):
        target, d = make(kind, vocab=vocab if kind == "eagle3" else None, loss=loss)
        ids = torch.randint(3, 259, (2, 12), generator=torch.Generator().manual_seed(0))
        feats, logits = features_of(target, d, ids)
        base = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids),
                "features": {k: v.detach() for k, v in feats.items()}}
        top = logits.detach().topk(16, -1)
        for batch in (dict(base, target_logits=logits.detach()),
                      dict(base, target_topk_values=top.values, target_topk_indices=top.indices)):
            value, metrics = d.compute_loss(batch)
            assert torch.isfinite(value) and value.requires_grad, (loss, vocab)
            value.backward()
            assert d.fc.weight.grad is not None and torch.isfinite(d.fc.weight.grad).all()
            d.zero_grad()
    assert d.loss == loss
    if loss == "tvd":  # the objective is one minus the expected acceptance of the drafter's own token law
        p, q = torch.randn(5, 9).softmax(-1), torch.randn(5, 9)
        accept = torch.minimum(p, q.softmax(-1)).sum(-1)
        assert torch.allclose(token_loss("tvd", q, p.log()), 1 - accept, atol=1e-6)


def test_eagle31_norms_train_and_decode_losslessly(target):
    cfg = DrafterConfig.for_kind("eagle3", draft_vocab=150, ttt_steps=3, **EAGLE31)
    torch.manual_seed(0)
    d = build_drafter(cfg, target.model, torch.arange(target.vocab_size).flip(0))
    ids = torch.randint(3, 259, (2, 12))
    feats, logits = features_of(target.model, d, ids)
    loss, _ = d.compute_loss({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                              "loss_mask": torch.ones_like(ids), "features": feats, "target_logits": logits})
    loss.backward()
    assert d.fc_norm[0].weight.grad is not None and d.input_norm is None
    decoder = SpeculativeDecoder(target, EagleProposer(d.eval(), ServingTree(topk=3, depth=4, budget=7)))
    for prompt in ([5, 9, 11, 40, 7], list(range(20, 44))):
        assert decoder.generate(prompt, 24).output_ids == hf_generate(target, prompt, 24)[0]


def test_joint_counters_on_given_hits():
    """A chain rooted at s is right through depth j when steps 0..j are right at s..s+j (speculators' joint
    counters); the conditional rate is joint j / joint j-1, and the product of marginal accuracies differs."""
    from draftsmith.heads.eagle.ttt import joint_metrics

    hit0 = torch.tensor([[1, 1, 0, 1]], dtype=torch.bool)
    # step 1 at t drafts depth 1 of the chain rooted at t-1
    hit1 = torch.tensor([[0, 0, 1, 0]], dtype=torch.bool)
    m = joint_metrics([hit0, hit1], torch.ones(1, 4, dtype=torch.bool), 2)
    # depth 0: 3 of 4 right; depth 1: of those 3, roots 0 and 1 have a depth-1 trial (root 3 runs past the
    # end), and only root 1 (hit1 at t=2) is right: 1/2; the marginal step-1 accuracy (1/3 over t >= 1) is
    # another number
    assert m["cond_acc/step0"] == pytest.approx(3 / 4) and m["cond_acc/step1"] == pytest.approx(1 / 2)
    assert (m["joint_acc/step1"] == pytest.approx(3 / 8)
            and m["expected_tau_joint"] == pytest.approx(1 + 3 / 4 + 3 / 8))
    # a root whose chain reaches an uncounted position is no trial at that depth
    counted = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    m = joint_metrics([hit0 & counted, hit1 & counted], counted, 2)
    assert m["cond_acc/step0"] == pytest.approx(2 / 3) and m["cond_acc/step1"] == pytest.approx(1 / 2)


@pytest.mark.parametrize("kind", KINDS)
def test_validation_reports_joint_counters_beside_the_marginal_estimate(kind):
    """In eval mode every EAGLE drafter reports joint and conditional rates per unrolled step and
    `expected_tau_joint`; step 0's joint rate is its top-1 accuracy, and joint rates never rise with depth."""
    target, d = make(kind, vocab=100)
    ids = torch.randint(0, 259, (2, 14))
    feats, logits = features_of(target, d, ids)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids),
             "features": feats, "target_logits": logits}
    d.eval()
    with torch.no_grad():
        _, metrics = d.compute_loss(batch)
    steps = d.ttt_steps
    joint = [metrics[f"joint_acc/step{j}"] for j in range(steps)]
    assert joint[0] == pytest.approx(metrics["acc_top1/step0"])
    assert (all(b <= a + 1e-9 for a, b in zip(joint, joint[1:]))
            and 1.0 <= metrics["expected_tau_joint"] <= 6.0)
    d.train()
    _, metrics = d.compute_loss(batch)
    assert "expected_tau_joint" not in metrics  # training steps pay nothing for it


def test_a_frozen_draft_lm_head_keeps_the_targets_rows():
    """drafter.eagle3.train_lm_head=false: the draft head starts as the target's rows for the draft vocabulary
    and stays there (no gradient, not handed to the optimizer); the default trains it."""
    for train_head in (False, True):
        target, d = make("eagle3", vocab=100, train_lm_head=train_head)
        rows = target.get_output_embeddings().weight[d.draft_to_target(torch.arange(100))]
        assert torch.equal(d.lm_head.weight, rows.float()) and d.lm_head.weight.requires_grad == train_head
        ids = torch.randint(0, 259, (2, 12))
        feats, logits = features_of(target, d, ids)
        loss, _ = d.compute_loss({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                                  "loss_mask": torch.ones_like(ids), "features": feats,
                                  "target_logits": logits})
        loss.backward()
        assert (d.lm_head.weight.grad is None) != train_head and d.fc.weight.grad is not None


def test_lookup_predicted_is_the_prompt_lookup_proposers_first_token():
    """heads/losses.lookup_predicted marks token t exactly when prompt lookup over ids[:t] (the proposer
    itself, n-grams 3..1, latest match) drafts it first; on random short sequences over small vocabularies
    (many repeats)."""
    from draftsmith.heads.losses import lookup_predicted
    from draftsmith.heads.prompt_lookup.proposer import PromptLookupProposer

    lookup, g, marked = PromptLookupProposer(num_tokens=1, ngram_max=3,
                                             ngram_min=1), torch.Generator().manual_seed(0), 0
    for _ in range(60):
        T, V = int(torch.randint(1, 30, (1,), generator=g)), int(torch.randint(2, 6, (1,), generator=g))
        ids = torch.randint(0, V, (2, T), generator=g)
        got = lookup_predicted(ids, 3, 1)
        for row, seq in zip(got.tolist(), ids.tolist()):
            want = [bool((c := lookup.continuations(seq[:t])) and c[0][0] == seq[t]) for t in range(T)]
            assert row == want, seq
            marked += sum(want)
    assert marked > 100  # the check saw many positions lookup does draft


@pytest.mark.parametrize("kind", KINDS)
def test_lookup_weight_weighs_the_positions_prompt_lookup_drafts(kind):
    """drafter.lookup_weight: 1 leaves the loss as it was; w < 1 changes it (the weighted mean of the
    per-position loss, lookup-drafted positions at w) and leaves the accuracies alone; a kind without it
    refuses the setting."""
    # a repeat: lookup drafts its second half
    ids = torch.tensor([[5, 9, 11, 40, 7, 5, 9, 11, 40, 7, 5, 9, 11, 3]])
    losses, accs = {}, {}
    for w in (1.0, 0.25):
        target, d = make(kind, vocab=100, lookup_weight=w)
        feats, logits = features_of(target, d, ids)
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids),
                 "features": {k: v.detach() for k, v in feats.items()}, "target_logits": logits.detach()}
        loss, metrics = d.compute_loss(batch)
        losses[w], accs[w] = loss.item(), metrics["acc_top1/step0"]
        if w != 1:
            assert 0.3 < metrics["lookup_share"] < 0.8
    assert losses[0.25] != pytest.approx(losses[1.0]) and accs[0.25] == accs[1.0]
    with pytest.raises(ValueError, match="drafter.lookup_weight.*eagle"):
        DrafterConfig.for_kind("medusa", lookup_weight=0.5)
    with pytest.raises(ValueError, match=r"lookup_weight must be in \(0, 1\]"):
        DrafterConfig.for_kind(kind, lookup_weight=0)


def test_acceptance_step_weights_follow_the_expected_accepted_length():
    """`drafter.eagle3.step_weights: acceptance` with the tvd loss (1 - s per step and position): the loss's
    gradient is -grad(sum over chains of the expected accepted length sum_m prod_{j<=m} s_{a,j}) / sum W,
    where the chain from position a drafts at step j from position a + j and s = sum min(q, p) is recomputed
    here from the unrolled steps and the target; the twin, the fixed decay weights, is not."""
    from draftsmith.heads.losses import chain_weights

    ids = torch.randint(3, 259, (2, 12), generator=torch.Generator().manual_seed(5))

    def grads(step_weights):
        target, d = make("eagle3", loss="tvd", step_weights=step_weights)
        feats, logits = features_of(target, d, ids)
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids),
                 "features": {k: v.detach() for k, v in feats.items()}, "target_logits": logits.detach()}
        loss, metrics = d.compute_loss(batch)
        n = ids.shape[1] - 2
        outs = d.unroll(d.fuse(batch["features"])[:, :n], ids[:, 1:n + 1], d.ttt_steps)
        p = logits.detach()[:, 1:n + 1].softmax(-1)  # the target at t for x_{t+2}
        columns = []
        for j, out in enumerate(outs):  # the chain from a drafts x_{a+j+2} at step j from position a + j
            s = torch.minimum(d.logits(out).softmax(-1), p).sum(-1)  # [2, n] by position
            columns.append(torch.cat([s[:, j:], s.new_zeros(2, j)], 1))  # by anchor a = t - j
        accept = torch.stack(columns, -1)  # [2, n anchors, steps]
        expected = accept.cumprod(-1).sum()
        exists = (torch.arange(n)[:, None] + torch.arange(d.ttt_steps)[None, :]) < n  # [anchors, steps]
        weight = (chain_weights(accept.detach()) * exists).sum()  # the steps a chain has
        w = d.fc.weight
        ours = torch.autograd.grad(loss, w, retain_graph=True)[0]
        assert step_weights == "decay" or metrics["step_weight_mean"] > 0
        return ours, -torch.autograd.grad(expected, w)[0] / weight

    assert_follows_expected_length(grads)
    with pytest.raises(ValueError, match="step_weights 'nope' unknown"):
        DrafterConfig.for_kind("eagle3", step_weights="nope")


def test_acceptance_step_weights_read_every_teacher():
    """The step weights from the target's top-k (all of it) equal those from its dense logits, on a reduced
    vocabulary too; without a teacher (ce) they come from q(label) and stay finite; a chain from a position
    that is not counted weighs nothing after its first step."""
    ids = torch.randint(3, 259, (2, 12), generator=torch.Generator().manual_seed(7))
    for vocab in (None, 100):
        target, d = make("eagle3", vocab=vocab, step_weights="acceptance")
        feats, logits = features_of(target, d, ids)
        n = ids.shape[1] - 2
        mask = torch.ones(2, 12, dtype=torch.long)
        mask[0, :6] = 0  # the first prompt's first 4 labels are not counted
        base = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": mask,
                "features": {k: v.detach() for k, v in feats.items()}}
        top = logits.detach().topk(logits.shape[-1], -1)
        counted = mask[:, 2:].bool()
        with torch.no_grad():
            outs = d.unroll(d.fuse(base["features"])[:, :n], ids[:, 1:n + 1], d.ttt_steps)
            masks = step_masks(counted, len(outs))
            step_logits = [d.logits(out[m]) for out, m in zip(outs, masks)]
            dense = acceptance_weights(d, step_logits, masks, ids[:, 2:],
                                       d._teacher(dict(base, target_logits=logits), n))
            sparse = acceptance_weights(d, step_logits, masks, ids[:, 2:], d._teacher(
                dict(base, target_topk_values=top.values, target_topk_indices=top.indices), n))
            plain = acceptance_weights(d, step_logits, masks, ids[:, 2:], None)
        for j in range(d.ttt_steps):
            assert torch.allclose(dense[j], sparse[j], atol=1e-6)
            assert torch.isfinite(plain[j]).all() and (plain[j][:, :j] == 0).all()
            if j:  # a chain from an uncounted position (a < 4: the prompt) weighs 0 after its first step
                assert (dense[j][0, j:4 + j] == 0).all() and (dense[j][0, 4 + j:] > 0).all()
        assert (dense[0][counted] >= 1).all()  # step 0 of a counted chain: reached, 1 + what follows
