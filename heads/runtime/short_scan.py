"""Short-block scans: a verification's recurrent states at every position, in one call per layer.

Where it sits: a verification on a target with recurrent layers (gated delta net: Qwen3.5, Qwen3-Next,
OLMo-hybrid; Mamba-2 / SSD: Nemotron-H, Falcon-H1, Granite-4, Bamba, Zamba2) must keep the state after each
verified token, so a rejected draft can be rolled back (heads/runtime/kv_cache.py `record`, `crop_cache`).
transformers' own past recording does it by running the chunked scan on nothing and then every recorded token
through the one-token kernel, one call (a dozen tensor ops) per token per layer; and without recording, its
reference chunked scan pads a block of 5 tokens to a chunk of 64 (docs/results/targets.md times a chain-4
verification both ways on the tiny families: scripts/bench/targets/targets.py).

What this does instead: for a verification of at most `MAX_BLOCK` tokens inside `recorded(model, cache, T)`,
the modeling module's reference chunked scan (transformers names it `torch_chunk_gated_delta_rule` /
`mamba2_chunk_scan`, its kernel slots `chunk_gated_delta_rule` / `mamba_chunk_scan_combined`, the ones the
`kernels` hub or FLA / mamba-ssm fill on GPUs) is served by a short scan that computes each token with the
one-token kernel's own operations (so its numbers are the ones HF `generate` decodes with on the CPU) and
returns the state after every token as a list: transformers' cache takes such a list as the states to roll
back to (`update_recurrent_state`, cache layers' `record_past`), so `kv_cache.record(..., short=True)` asks
the model for no per-token recording at all. Every other call (prefill, other threads, packed sequences) goes
to transformers' function unchanged.
The decoder and the plan's cost curve wrap each verification forward in `recorded`; where the short scans do
not serve (`serves`: another scan, e.g. Kimi's KDA; a block longer than MAX_BLOCK; fused kernels on an
accelerator; DRAFTSMITH_SHORT_SCANS=0) it asks for transformers' recording instead.

No modeling file is forked or edited: the two module attributes are wrapped once (`_install`, the slots
`kernels.kernelize` fills) by a stand-in that calls transformers' own function unless a `recorded` block of
this thread or task is open (a context variable). `kv_cache.crop_cache` checks that every recurrent layer
holds one state per verified token, so a layer that slipped past would fail loudly instead of rolling back
to a wrong state.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import importlib.util
import os
import threading
import weakref
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

from draftsmith.heads.runtime.kv_cache import record

MAX_BLOCK = 64  # a longer verification keeps transformers' recording (its loop costs as much per token)
_LOCK = threading.Lock()  # installs the stand-ins one thread at a time
_SERVING: contextvars.ContextVar[bool] = contextvars.ContextVar("draftsmith_short_scans", default=False)
# model -> (its modeling modules that define one of KERNELS, the fused packages that would serve those scans
# on an accelerator): read once per model, not per verification
_SERVED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _l2norm(x: torch.Tensor) -> torch.Tensor:  # as the one-token kernel normalises q and k
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)


def gated_delta_rule(query, key, value, g, beta, chunk_size: int = 64, initial_state=None,
                     output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False, **kwargs):
    """The gated delta rule over a short block, token by token with the one-token kernel's operations;
    -> (output [B, T, Hv, Dv], the state after every token as a list of [B, Hv, Dk, Dv], or None)."""
    dtype = query.dtype
    batch, length, k_heads, k_dim = key.shape
    v_heads, v_dim = value.shape[-2:]
    if k_heads != v_heads:  # grouped values: each q/k head serves v_heads // k_heads value heads
        query = query.repeat_interleave(v_heads // k_heads, dim=2)
        key = key.repeat_interleave(v_heads // k_heads, dim=2)
    # [B, H, T, D] and [B, H, T], fp32
    query, key, value, beta, g = (x.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)
                                  for x in (query, key, value, beta, g))
    if use_qk_l2norm_in_kernel:
        query, key = _l2norm(query), _l2norm(key)
    query = query / (k_dim ** 0.5)
    state = (torch.zeros(batch, v_heads, k_dim, v_dim, dtype=value.dtype, device=value.device)
             if initial_state is None else initial_state.to(value))  # [B, H, Dk, Dv]
    # per token, the kernel's own slices (views): decay [B, H, 1, 1], k and q [B, H, D, 1], v [B, H, Dv], beta
    # [B, H, 1]; one unbind each instead of a slice per token (the loop is dispatch-bound on small layers)
    per_token = zip(g[..., None, None].unbind(2), key.unsqueeze(-1).unbind(2), query.unsqueeze(-1).unbind(2),
                    value.unbind(2), beta.unsqueeze(-1).unbind(2))
    outs, states = [], []
    for decay, k_t, q_t, v_t, beta_t in per_token:
        state = state * decay.exp()
        delta = (v_t - (state * k_t).sum(dim=-2)) * beta_t  # [B, H, Dv]
        state = state + k_t * delta.unsqueeze(-2)
        outs.append((state * q_t).sum(dim=-2))  # [B, H, Dv]
        states.append(state)
    out = torch.stack(outs, 1).to(dtype)  # [B, T, H, Dv]
    return out, (states if output_final_state else None)


def ssd_scan(hidden_states, dt, A, B, C, chunk_size: int = 256, D=None, dt_bias=None, initial_states=None,
             dt_softplus: bool = False, dt_limit=(0.0, float("inf")), return_final_states: bool = False,
             **kwargs):
    """A Mamba-2 (SSD) scan over a short block, token by token with the one-token kernel's operations;
    -> output [B, T, H, P] (and, with `return_final_states`, the state after every token as a list of
    [B, H, P, N])."""
    batch, length, heads, head_dim = hidden_states.shape
    groups, size = B.shape[2], B.shape[3]
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    dt = dt.unsqueeze(-1).expand(-1, -1, -1, head_dim)[..., None]  # [B, T, H, P, 1]
    dA = torch.exp(dt.float() * A.float()[:, None, None])  # [B, T, H, P, 1] (the same over N)
    per_head = heads // groups

    def by_head(x):  # [B, T, G, N] -> [B, T, H, 1, N]
        return x[:, :, :, None].expand(-1, -1, -1, per_head, -1).reshape(batch, length, heads, 1, size)

    dBx = dt * by_head(B) * hidden_states[..., None]  # [B, T, H, P, N]
    Ct = by_head(C).reshape(batch, length, heads, size, 1)
    state = (torch.zeros(batch, heads, head_dim, size, dtype=torch.float32, device=hidden_states.device)
             if initial_states is None else initial_states)
    # per token: one unbind each instead of a slice per token (the loop is dispatch-bound on small layers)
    reads = Ct.transpose(0, 1).reshape(length, batch * heads, size, 1).unbind(0)  # C_t as the kernel reads it
    outs, states = [], []
    for dA_t, dBx_t, C_t in zip(dA.unbind(1), dBx.unbind(1), reads):
        new = state * dA_t + dBx_t  # [B, H, P, N]
        state = new.to(state.dtype)
        # read in C's dtype, as the kernel reads it
        out = torch.bmm(new.to(C_t.dtype).reshape(batch * heads, head_dim, size), C_t)
        outs.append(out.view(batch, heads, head_dim))
        states.append(state)
    output = torch.stack(outs, 1)  # [B, T, H, P]
    if D is not None:
        output = (output + hidden_states * D[:, None]).to(output.dtype)
    output = output.to(hidden_states.dtype)
    return (output, states) if return_final_states else output


def _applies(args, kwargs) -> bool:
    """Stand in for transformers' scan: inside `recorded` (this thread or task), for a block of at most
    MAX_BLOCK tokens whose states the caller keeps, unpacked and ungated (the verifications' calls)."""
    first = args[0] if args else next(iter(kwargs.values()))
    keeps = kwargs.get("output_final_state", kwargs.get("return_final_states", False))
    return (_SERVING.get() and bool(keeps) and 1 <= first.shape[1] <= MAX_BLOCK
            and all(kwargs.get(k) is None for k in ("cu_seqlens", "seq_idx", "z")))


# transformers' reference function name -> (the short scan, the package whose fused kernel transformers
# takes instead on an accelerator: there transformers' recording runs through fused one-token kernels)
KERNELS: dict[str, tuple[Callable, str]] = {
    "torch_chunk_gated_delta_rule": (gated_delta_rule, "fla"),
    "mamba2_chunk_scan": (ssd_scan, "mamba_ssm"),
}


def _served(model: torch.nn.Module) -> tuple[list, bool]:
    """(the modeling modules of `model`'s classes that define one of KERNELS, whether a fused package for one
    of those scans is installed), once per model."""
    if model not in _SERVED:
        modules, packages = [], set()
        for module in map(importlib.import_module, sorted({type(m).__module__ for m in model.modules()})):
            kinds = [k for k in KERNELS if callable(getattr(module, k, None))]
            if kinds:
                modules.append(module)
                packages.update(KERNELS[k][1] for k in kinds)
        _SERVED[model] = modules, any(importlib.util.find_spec(p) for p in packages)
    return _SERVED[model]


def covers(model: torch.nn.Module) -> bool:
    """Whether the model's recurrent scans are served here (a modeling module defines one of KERNELS)."""
    return bool(_served(model)[0])


def serves(model: torch.nn.Module, tokens: int) -> bool:
    """Whether a verification of `tokens` positions on `model` takes the short scans: they cover the model,
    the block is short, DRAFTSMITH_SHORT_SCANS is not 0, and no fused kernel would run instead (the `kernels`
    hub's layers, or FLA / mamba-ssm on an accelerator)."""
    if os.environ.get("DRAFTSMITH_SHORT_SCANS", "1") == "0" or not 1 <= tokens <= MAX_BLOCK:
        return False
    modules, fused = _served(model)
    if getattr(model, "_use_kernels", False) or not modules:
        return False
    return not fused or next(model.parameters()).device.type == "cpu"


def _stand_in(name: str, original: Callable) -> Callable:
    def scan(*args, **kwargs):
        return KERNELS[name][0](*args, **kwargs) if _applies(args, kwargs) else original(*args, **kwargs)

    scan.draftsmith_short_scan, scan.original = True, original
    return scan


def _install(model: torch.nn.Module) -> None:
    """The stand-ins in the model's modeling modules, once (outside `recorded` they call transformers' own
    function; one that something else replaced since is wrapped again)."""
    with _LOCK:
        for module in _served(model)[0]:
            for name in KERNELS:
                current = getattr(module, name, None)
                if callable(current) and not getattr(current, "draftsmith_short_scan", False):
                    setattr(module, name, _stand_in(name, current))


@contextlib.contextmanager
def recorded(model: torch.nn.Module, cache, tokens: int) -> Iterator[bool]:
    """Around a forward of `tokens` positions that may be rolled back (a verification): every token's
    recurrent state is kept, by the short scans where they serve (`serves`), else by transformers' own past
    recording (kv_cache.record; nothing on a cache without recurrent layers). Yields whether the short scans
    serve it. Only this thread's (task's) forwards inside the block see them."""
    short = serves(model, tokens)
    if short:
        _install(model)
    record(cache, tokens, short=short)
    token = _SERVING.set(short)
    try:
        yield short
    finally:
        _SERVING.reset(token)
