"""Short-block scans (heads/runtime/short_scan.py): a verification's recurrent states at every position.

What must hold for the decoder to roll back a hybrid target through them:
- outputs and every kept state equal transformers' own past recording (gated delta nets: bitwise; Mamba-2:
  to fp32 rounding of its one-token kernel's vectorised ops), so a chain rolled back to any length continues
  exactly as if it had been decoded that far; the family matrix (test_families.py) then checks greedy
  equality with HF `generate` and the exact node laws on every family with these scans in place;
- forwards longer than MAX_BLOCK (prefill) go to transformers' chunked scan, and the module attributes are
  transformers' own again after the block, an exception too;
- a family the scans do not serve keeps transformers' recording (`covers` False), and a cache recorded for
  short scans that did not run refuses to crop (twin: it would restore a stale state);
- twin: a scan handing over its states one position late is caught by the rolled-back continuation.
"""

from __future__ import annotations

import importlib
import threading

import families
import pytest
import torch

from draftsmith.heads.runtime import kv_cache, short_scan
from draftsmith.heads.runtime.short_scan import covers

pytestmark = pytest.mark.usefixtures("one_thread")

GATED_DELTA = ["qwen3_5", "qwen3_next", "qwen3_5_moe"]
MAMBA2 = ["falcon_h1", "nemotron_h", "granitemoehybrid", "bamba", "zamba2"]
PREFIX = torch.randint(3, 259, (1, 40), generator=torch.Generator().manual_seed(1))
DRAFT = torch.randint(3, 259, (1, 5), generator=torch.Generator().manual_seed(3))
# two Mamba-2 hybrids tests/families.py does not hold (their modeling files define the same scan)
EXTRA = {
    "bamba": ("BambaConfig", "BambaForCausalLM",
              dict(attn_layer_indices=[1], mamba_n_heads=4, mamba_d_head=8, mamba_d_state=8, mamba_n_groups=1,
                   mamba_expand=1, mamba_chunk_size=16, num_key_value_heads=2, num_hidden_layers=2)),
    "zamba2": ("Zamba2Config", "Zamba2ForCausalLM",
               dict(mamba_d_state=8, mamba_headdim=8, n_mamba_heads=8, mamba_ngroups=1, mamba_expand=2,
                    layers_block_type=["mamba", "hybrid", "mamba", "mamba"], num_mem_blocks=1, chunk_size=16,
                    attention_head_dim=16, num_key_value_heads=4, num_hidden_layers=4,
                    # a finite dt floor, as Zamba2's default: the one-token kernel ignores it
                    time_step_limit=(0.001, float("inf")))),
}


@pytest.fixture(scope="module")
def models():
    return {}


def model_of(name: str, models: dict, dtype=torch.float32):
    if (name, dtype) not in models:
        if name in EXTRA:
            import transformers

            config_cls, model_cls, shape = EXTRA[name]
            torch.manual_seed(0)
            config = getattr(transformers, config_cls)(vocab_size=259, hidden_size=32, intermediate_size=64,
                                                       num_attention_heads=4, **shape)
            model = getattr(transformers, model_cls)(config)
        else:
            model = families.build_family_model(name)
        models[name, dtype] = model.to(dtype).eval()
    return models[name, dtype]


def verify_then_continue(model, keep: int, short: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill PREFIX, verify DRAFT (5 tokens, recorded: by the short scans, or by transformers), roll back to
    `keep` of them, feed token 9 -> (the verification's logits [1, 5, V], the continuation's [1, 1, V])."""
    cache = kv_cache.new_cache(model.config)
    with torch.inference_mode():
        model(PREFIX, cache=cache, use_cache=True)
        if short:
            with short_scan.recorded(model, cache, DRAFT.shape[1]) as served:
                assert served
                out = model(DRAFT, cache=cache, use_cache=True).logits
        else:
            kv_cache.record(cache, DRAFT.shape[1])
            out = model(DRAFT, cache=cache, use_cache=True).logits
        kv_cache.crop_cache(cache, PREFIX.shape[1] + keep)
        nxt = model(torch.tensor([[9]]), cache=cache, use_cache=True).logits
    return out, nxt


@pytest.mark.parametrize("name", GATED_DELTA + MAMBA2)
def test_short_scans_equal_transformers_recording_at_every_rollback(name, models):
    model = model_of(name, models)
    assert covers(model)
    exact = name in GATED_DELTA
    for keep in (1, 3, 5):
        out, nxt = verify_then_continue(model, keep, short=True)
        ref_out, ref_nxt = verify_then_continue(model, keep, short=False)
        if exact:
            assert torch.equal(out, ref_out) and torch.equal(nxt, ref_nxt), keep
        else:
            torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-5)
            torch.testing.assert_close(nxt, ref_nxt, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["qwen3_5", "nemotron_h"])
def test_short_scans_in_bfloat16(name, models):
    """A bf16 target (the scans keep fp32 states, the SSD output is read in C's dtype as the kernel does):
    the rollback continues as transformers' recording does, to bf16 rounding."""
    model = model_of(name, models, torch.bfloat16)
    for keep in (2, 5):
        out, nxt = verify_then_continue(model, keep, short=True)
        ref_out, ref_nxt = verify_then_continue(model, keep, short=False)
        torch.testing.assert_close(out.float(), ref_out.float(), rtol=0, atol=0.1)
        torch.testing.assert_close(nxt.float(), ref_nxt.float(), rtol=0, atol=0.1)


@pytest.mark.parametrize("name", ["qwen3_5", "nemotron_h"])
def test_a_scan_handing_over_its_states_one_position_late_is_caught(name, models, monkeypatch):
    """Twin: each token given the state after the next one (the last kept as is): the rolled-back
    continuation differs from the recorded one."""
    model = model_of(name, models)
    kernel = next(k for k in short_scan.KERNELS if callable(getattr(
        importlib.import_module(type(model).__module__), k, None)))
    short, package = short_scan.KERNELS[kernel]

    def late(*args, **kwargs):
        result = short(*args, **kwargs)
        out, states = result if isinstance(result, tuple) else (result, None)
        if not isinstance(states, list):
            return result
        return out, [*states[1:], states[-1]]

    monkeypatch.setitem(short_scan.KERNELS, kernel, (late, package))
    _, nxt = verify_then_continue(model, 2, short=True)
    _, ref = verify_then_continue(model, 2, short=False)
    assert (nxt - ref).abs().max() > 1e-3


def counting(monkeypatch) -> list[int]:
    """Every call the qwen3_5 short scan serves, by block length."""
    calls = []
    short, package = short_scan.KERNELS["torch_chunk_gated_delta_rule"]
    monkeypatch.setitem(short_scan.KERNELS, "torch_chunk_gated_delta_rule",
                        (lambda *a, **k: calls.append(a[0].shape[1]) or short(*a, **k), package))
    return calls


def test_only_a_recorded_verification_takes_the_short_scans(models, monkeypatch):
    """Prefill inside the block (longer than MAX_BLOCK), a short forward outside it, and a forward of another
    thread while this one's block is open all run transformers' own scan; a stand-in replaced since (as
    kernelize would) is wrapped again."""
    model = model_of("qwen3_5", models)
    module = importlib.import_module(type(model).__module__)
    calls, cache = counting(monkeypatch), kv_cache.new_cache(model.config)
    prefill = torch.randint(3, 259, (1, short_scan.MAX_BLOCK + 6))
    with torch.inference_mode():
        with short_scan.recorded(model, cache, prefill.shape[1]) as served:
            assert not served
            model(prefill, cache=cache, use_cache=True)
        kv_cache.crop_cache(cache, prefill.shape[1])
        other = kv_cache.new_cache(model.config)
        model(PREFIX, cache=other, use_cache=True)
        model(DRAFT[:, :3], cache=other, use_cache=True)  # outside any block
        assert calls == []
        current = module.torch_chunk_gated_delta_rule  # a stand-in if an earlier test installed one
        replaced = getattr(current, "original", current)  # as kernelize would put its own in
        monkeypatch.setattr(module, "torch_chunk_gated_delta_rule", replaced)
        with short_scan.recorded(model, cache, 3) as served:
            assert served
            seen = []
            thread = threading.Thread(target=lambda: seen.append(verify_then_continue(model, 2, short=False)))
            thread.start()
            thread.join()
            model(DRAFT[:, :3], cache=cache, use_cache=True)
        kv_cache.crop_cache(cache, prefill.shape[1] + 1)
    # one call per gated-delta layer, all of this thread's 3-token block: the other thread's 5-token
    # verification was transformers' own
    assert calls and set(calls) == {3} and len(seen) == 1


def test_a_block_longer_than_the_short_scans_take_is_recorded_by_transformers(models, monkeypatch):
    """short_scan.recorded: past MAX_BLOCK the verification falls back to transformers' own recording, and
    the rollback still holds (a long block recorded for short scans that never ran could not be cropped)."""
    model = model_of("qwen3_5", models)
    monkeypatch.setattr(short_scan, "MAX_BLOCK", 3)
    cache = kv_cache.new_cache(model.config)
    with torch.inference_mode():
        model(PREFIX, cache=cache, use_cache=True)
        with short_scan.recorded(model, cache, DRAFT.shape[1]) as served:
            assert not served
            model(DRAFT, cache=cache, use_cache=True)
        kv_cache.crop_cache(cache, PREFIX.shape[1] + 2)
        nxt = model(torch.tensor([[9]]), cache=cache, use_cache=True).logits
    monkeypatch.undo()
    assert torch.equal(nxt, verify_then_continue(model, 2, short=False)[1])


def test_short_scans_can_be_switched_off(models, monkeypatch):
    model = model_of("qwen3_5", models)
    monkeypatch.setenv("DRAFTSMITH_SHORT_SCANS", "0")
    assert not short_scan.serves(model, 5)
    monkeypatch.delenv("DRAFTSMITH_SHORT_SCANS")
    assert short_scan.serves(model, 5)


def test_the_plans_verification_cost_runs_on_a_hybrid_target(models):
    """eval/measure/plan.py verify_cost crops the cache back after every forward: on a recurrent target each
    forward is recorded as a verification is (it crashed in transformers' crop before)."""
    from helpers import build_tiny_tokenizer

    from draftsmith.distill.target import Target
    from draftsmith.eval.measure.plan import verify_cost

    target = Target(model_of("falcon_h1", models), build_tiny_tokenizer(), name="falcon_h1")
    cost = verify_cost(target, ks=(1, 4, short_scan.MAX_BLOCK + 1), context=24, reps=1)
    assert set(cost) == {1, 4, short_scan.MAX_BLOCK + 1} and all(ms > 0 for ms in cost.values())


@pytest.mark.parametrize("name", ["llama", "lfm2"])
def test_families_without_these_scans_keep_transformers_recording(name, models):
    model = model_of(name, models)
    assert not covers(model) and not short_scan.serves(model, 5)


def test_a_cache_recorded_for_short_scans_that_did_not_run_refuses_to_crop(models):
    """Twin of the check in kv_cache.crop_cache: recorded with short=True but verified without the scans, each
    recurrent layer holds one state for five tokens, and a crop would restore it for any length; a second
    crop is refused too."""
    model = model_of("qwen3_5", models)
    cache = kv_cache.new_cache(model.config)
    with torch.inference_mode():
        model(PREFIX, cache=cache, use_cache=True)
        kv_cache.record(cache, 5, short=True)
        model(DRAFT, cache=cache, use_cache=True)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="holds 1 recurrent states after a verification of 5 tokens"):
            kv_cache.crop_cache(cache, PREFIX.shape[1] + 2)
