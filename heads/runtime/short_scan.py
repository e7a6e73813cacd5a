"""Short-block scans: a verification's recurrent states at every position, in one call per layer.

Where it sits: a verification on a target with recurrent layers (gated delta net: Qwen3.5, Qwen3-Next,
OLMo-hybrid; Mamba-2 / SSD: Nemotron-H, Falcon-H1, Granite-4, Bamba, Zamba2) must keep the state after each
verified token, so a rejected draft can be rolled back (heads/runtime/kv_cache.py `record`, `crop_cache`).
transformers' own past recording does it by running the chunked scan on nothing and then every recorded token
through the one-token kernel, one call (a dozen tensor ops) per token per layer; and without recording, its
reference chunked scan pads a block of 5 tokens to a chunk of 64. Measured on the tiny families (one thread,
scripts/bench/targets/targets.py), a chain-4 verification then cost 1.6–2.1x a plain step.

What this does instead: for a forward of at most `MAX_BLOCK` tokens under `short_blocks(model)`, the modeling
module's reference chunked scan (transformers names it `torch_chunk_gated_delta_rule` / `mamba2_chunk_scan`,
its kernel slots `chunk_gated_delta_rule` / `mamba_chunk_scan_combined`, the ones the `kernels` hub or FLA /
mamba-ssm fill on GPUs) is served by a short scan that computes each token with the one-token kernel's own
operations (so its numbers are the ones HF `generate` decodes with) and returns the state after every token as
a list: transformers' cache takes such a list as the states to roll back to (`update_recurrent_state`, cache
layers' `record_past`), so `kv_cache.record(..., short=True)` asks the model for no per-token recording at
all. Longer forwards (prefill), packed sequences and gated scans go to transformers' function unchanged.
`recorded(model, cache, tokens)` is what a verification (the decoder, the plan's cost curve) wraps its
forward in: short scans where they serve, transformers' recording otherwise.

No modeling file is forked or edited: the two module attributes are swapped for the forward and put back
(`short_blocks`), the slots `kernels.kernelize` fills. A family whose recurrent layers use another scan (say
Kimi's KDA) is not served here: `covers(model)` is False for it and its verification keeps
transformers' recording; `kv_cache.crop_cache` checks that every recurrent layer holds one state per verified
token, so a layer that slipped past both would fail loudly instead of rolling back to a wrong state.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import threading
import weakref
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

MAX_BLOCK = 64  # longer forwards (prefill) keep transformers' chunked scan
_LOCK = threading.RLock()  # the swap is process-wide: two threads' forwards take turns
_SERVED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its modeling modules with KERNELS


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
    out = torch.zeros_like(value)  # [B, H, T, Dv]
    decay = g.exp()[..., None, None]  # [B, H, T, 1, 1]
    states = []
    for t in range(length):
        k_t = key[:, :, t].unsqueeze(-1)  # [B, H, Dk, 1]
        state = state * decay[:, :, t]
        delta = (value[:, :, t] - (state * k_t).sum(dim=-2)) * beta[:, :, t].unsqueeze(-1)  # [B, H, Dv]
        state = state + k_t * delta.unsqueeze(-2)
        out[:, :, t] = (state * query[:, :, t].unsqueeze(-1)).sum(dim=-2)
        states.append(state)
    out = out.transpose(1, 2).contiguous().to(dtype)  # [B, T, H, Dv]
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
    outs, states = [], []
    for t in range(length):
        state = (state * dA[:, t] + dBx[:, t]).to(state.dtype)
        out = torch.bmm(state.view(batch * heads, head_dim, size), Ct[:, t].reshape(batch * heads, size, 1))
        outs.append(out.view(batch, heads, head_dim))
        states.append(state)
    output = torch.stack(outs, 1)  # [B, T, H, P]
    if D is not None:
        output = (output + hidden_states * D[:, None]).to(output.dtype)
    output = output.to(hidden_states.dtype)
    return (output, states) if return_final_states else output


def _gdn_applies(args, kwargs) -> bool:
    return kwargs.get("cu_seqlens") is None


def _ssd_applies(args, kwargs) -> bool:
    # the one-token kernel neither clamps dt nor gates: stand in only where the chunked scan would not either
    low, high = kwargs.get("dt_limit", (0.0, float("inf")))
    return kwargs.get("z") is None and kwargs.get("seq_idx") is None and low == 0.0 and math.isinf(high)


# transformers' reference function name -> (short scan, when it may stand in)
KERNELS: dict[str, tuple[Callable, Callable]] = {
    "torch_chunk_gated_delta_rule": (gated_delta_rule, _gdn_applies),
    "mamba2_chunk_scan": (ssd_scan, _ssd_applies),
}


def _modules(model: torch.nn.Module) -> list:
    """The modeling modules of `model`'s classes that define one of KERNELS."""
    names = {type(m).__module__ for m in model.modules()}
    found = []
    for name in sorted(names):
        module = importlib.import_module(name)
        if any(callable(getattr(module, kernel, None)) for kernel in KERNELS):
            found.append(module)
    return found


def covers(model: torch.nn.Module) -> bool:
    """Whether the model's recurrent scans are served here (a modeling module defines one of KERNELS)."""
    if model not in _SERVED:
        _SERVED[model] = _modules(model)
    return bool(_SERVED[model])


def _standing_in(short: Callable, applies: Callable, original: Callable) -> Callable:
    def scan(*args, **kwargs):
        first = args[0] if args else next(iter(kwargs.values()))
        if first.shape[1] <= MAX_BLOCK and applies(args, kwargs):
            return short(*args, **kwargs)
        return original(*args, **kwargs)

    scan.original = original
    return scan


@contextlib.contextmanager
def recorded(model: torch.nn.Module, cache, tokens: int) -> Iterator[None]:
    """Around a forward of `tokens` positions that may be rolled back (a verification): every token's
    recurrent state is kept, by the short scans where they serve the model and the block, else by
    transformers' own past recording (kv_cache.record; nothing on a cache without recurrent layers)."""
    from draftsmith.heads.runtime.kv_cache import record

    with short_blocks(model) if tokens <= MAX_BLOCK else contextlib.nullcontext(False) as short:
        record(cache, tokens, short=short)
        yield


@contextlib.contextmanager
def short_blocks(model: torch.nn.Module) -> Iterator[bool]:
    """Within: the model's short forwards scan with this module's kernels (the module doc); yields whether
    any were put in place."""
    if not covers(model):
        yield False
        return
    with _LOCK:
        swapped = []
        try:
            for module in _SERVED[model]:
                for name, (short, applies) in KERNELS.items():
                    original = getattr(module, name, None)
                    if callable(original) and not hasattr(original, "original"):
                        setattr(module, name, _standing_in(short, applies, original))
                        swapped.append((module, name, original))
            yield True
        finally:
            for module, name, original in swapped:
                setattr(module, name, original)
