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

import contextlib
import importlib

import families
import pytest
import torch

from draftsmith.heads.runtime import kv_cache, short_scan
from draftsmith.heads.runtime.short_scan import covers, short_blocks

pytestmark = pytest.mark.usefixtures("one_thread")

GATED_DELTA = ["qwen3_5", "qwen3_next", "qwen3_5_moe"]
MAMBA2 = ["falcon_h1", "nemotron_h", "granitemoehybrid"]
PREFIX = torch.randint(3, 259, (1, 40), generator=torch.Generator().manual_seed(1))
DRAFT = torch.randint(3, 259, (1, 5), generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module")
def models():
    return {}


def model_of(name: str, models: dict):
    if name not in models:
        models[name] = families.build_family_model(name).eval()
    return models[name]


def verify_then_continue(model, keep: int, short: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill PREFIX, verify DRAFT (5 tokens, recorded), roll back to `keep` of them, feed token 9 ->
    (the verification's logits [1, 5, V], the continuation's logits [1, 1, V])."""
    cache = kv_cache.new_cache(model.config)
    with torch.inference_mode():
        model(PREFIX, cache=cache, use_cache=True)
        with short_blocks(model) if short else contextlib.nullcontext(False) as served:
            assert served is short
            kv_cache.record(cache, DRAFT.shape[1], short=served)
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
def test_a_scan_handing_over_its_states_one_position_late_is_caught(name, models, monkeypatch):
    """Twin: each token given the state after the next one (the last kept as is): the rolled-back
    continuation differs from the recorded one."""
    model = model_of(name, models)
    kernel = next(k for k in short_scan.KERNELS if callable(getattr(
        importlib.import_module(type(model).__module__), k, None)))
    short, applies = short_scan.KERNELS[kernel]

    def late(*args, **kwargs):
        result = short(*args, **kwargs)
        out, states = result if isinstance(result, tuple) else (result, None)
        if not isinstance(states, list):
            return result
        return out, [*states[1:], states[-1]]

    monkeypatch.setitem(short_scan.KERNELS, kernel, (late, applies))
    _, nxt = verify_then_continue(model, 2, short=True)
    _, ref = verify_then_continue(model, 2, short=False)
    assert (nxt - ref).abs().max() > 1e-3


def test_prefill_keeps_transformers_scan_and_the_swap_is_undone(models, monkeypatch):
    model = model_of("qwen3_5", models)
    module = importlib.import_module(type(model).__module__)
    original, calls = module.torch_chunk_gated_delta_rule, []
    short, applies = short_scan.KERNELS["torch_chunk_gated_delta_rule"]
    monkeypatch.setitem(short_scan.KERNELS, "torch_chunk_gated_delta_rule",
                        (lambda *a, **k: calls.append(a[0].shape[1]) or short(*a, **k), applies))
    cache, prefill = kv_cache.new_cache(model.config), torch.randint(3, 259, (1, short_scan.MAX_BLOCK + 6))
    with torch.inference_mode(), short_blocks(model):
        assert module.torch_chunk_gated_delta_rule is not original
        model(prefill, cache=cache, use_cache=True)  # more than MAX_BLOCK tokens: transformers' scan
        assert calls == []
        kv_cache.record(cache, 3, short=True)
        model(DRAFT[:, :3], cache=cache, use_cache=True)
    assert calls and set(calls) == {3}
    assert module.torch_chunk_gated_delta_rule is original
    with pytest.raises(ValueError, match="boom"), short_blocks(model):
        raise ValueError("boom")
    assert module.torch_chunk_gated_delta_rule is original


def test_a_block_longer_than_the_short_scans_take_is_recorded_by_transformers(models, monkeypatch):
    """short_scan.recorded: past MAX_BLOCK the verification falls back to transformers' own recording, and
    the rollback still holds (before, a long block recorded for short scans that never ran would refuse to
    crop)."""
    model = model_of("qwen3_5", models)
    monkeypatch.setattr(short_scan, "MAX_BLOCK", 3)
    cache = kv_cache.new_cache(model.config)
    with torch.inference_mode():
        model(PREFIX, cache=cache, use_cache=True)
        with short_scan.recorded(model, cache, DRAFT.shape[1]):
            model(DRAFT, cache=cache, use_cache=True)
        kv_cache.crop_cache(cache, PREFIX.shape[1] + 2)
        nxt = model(torch.tensor([[9]]), cache=cache, use_cache=True).logits
    monkeypatch.undo()
    assert torch.equal(nxt, verify_then_continue(model, 2, short=False)[1])


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
    assert not covers(model)
    with short_blocks(model) as served:
        assert served is False


def test_a_cache_recorded_for_short_scans_that_did_not_run_refuses_to_crop(models):
    """Twin of the check in kv_cache.crop_cache: recorded with short=True but verified without the scans, each
    recurrent layer holds one state for five tokens, and a crop would restore it for any length."""
    model = model_of("qwen3_5", models)
    cache = kv_cache.new_cache(model.config)
    with torch.inference_mode():
        model(PREFIX, cache=cache, use_cache=True)
        kv_cache.record(cache, 5, short=True)
        model(DRAFT, cache=cache, use_cache=True)
    with pytest.raises(RuntimeError, match="holds 1 recurrent states after a verification of 5 tokens"):
        kv_cache.crop_cache(cache, PREFIX.shape[1] + 2)
