"""`draftsmith size`: what a recipe will cost before it runs — feature disk, GPU memory per process, tokens.

Reads config.json files only: the target's (a local folder, the HF cache, a converted preset, or
`--target-config`, a bare config.json or a vendored one by name from configs/models/), never its weights. The
target and the drafter are built on the meta device (no memory) to count parameters exactly as the code builds
them.

Figures and their formulas (the assumptions are printed with them):

    feature disk / token  distill/extract.py bytes_per_token, the figure `draftsmith extract` prints itself:
                          features x H x s + top_k x (s + 4) + 4 + 1
                          (s: extract.dtype bytes; features: what the kind reads plus extract.layers)
    GPU memory / process  target weights   P_target x bytes(model.dtype)            (online training only)
                          drafter, trained P_train x (4 weights + 4 grads + 8 AdamW m, v)  fp32, / shard
                          drafter, frozen  P_frozen x 4                   (copies such as EAGLE's embedding)
                          activations      tokens per micro-batch (train.batch_size x data.max_length) x
                                           [target logits V x (s_t + 4) + captured features F x H x s_t
                                              (online)
                                            + drafter logits steps x W x 4 x 2
                                            + drafter layers steps x L x 17 x H x a]
                          shard: DDP 1; ZeRO-2 divides grads and AdamW (12 of 16 B) by N;
                          ZeRO-3 / FSDP all 16 B
    tokens per epoch      the recipe's data tokenised with the target's tokenizer, each cut at data.max_length

W is the drafter's vocabulary-wide output width (its `lm_head` Linear layers, and any wider than the target's
MLP), steps its unrolled training steps (`ttt_steps`, else 1), L its decoder layers, a the activation bytes (2
under bf16/fp16 mixed precision, else 4); 17 x H x a is Korthikanti et al.'s per-layer activation count (34 s
b h bytes at 16 bits) without attention scores (SDPA/flash keep none). Activations are an estimate: measure a
few steps (train.max_steps=5) before a long run.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from types import SimpleNamespace

GB = 1e9
# fp32 weights 4 + grads 4 + AdamW m 4 + v 4 (a bf16 master scheme: 2 + 2 + 4 master + 8, the same)
ADAM_BYTES = 16
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def target_config(cfg, path: str | None = None) -> tuple[dict, Path | None, str]:
    """The target's config.json as a dict, the folder holding it (for the tokenizer) and where it came
    from."""
    from draftsmith.configs import shipped
    from draftsmith.distill.cache import draftsmith_home
    from draftsmith.distill.loading import PRESETS, looks_like_hub_id

    if path:
        file = Path(path).expanduser()
        if not file.is_file():
            vendored = shipped("models", f"{Path(path).name.removesuffix('.json')}.json")
            if not vendored.is_file():
                names = ", ".join(sorted(p.stem for p in shipped("models").glob("*.json")))
                raise FileNotFoundError(f"--target-config {path}: neither a file nor a vendored config "
                                        f"({names})")
            file = vendored
        file = file / "config.json" if file.is_dir() else file
        return json.loads(file.read_text()), (file.parent if (file.parent / "tokenizer_config.json").is_file()
                                              else None), str(file)
    name = cfg.model.target
    folder = Path(name).expanduser()
    if name in PRESETS:
        folder = draftsmith_home() / "targets" / name
    if (folder / "config.json").is_file():
        return json.loads((folder / "config.json").read_text()), folder, str(folder / "config.json")
    if looks_like_hub_id(name) and not folder.exists():
        from huggingface_hub import try_to_load_from_cache

        from draftsmith.distill.loading import hub_cache

        cached = try_to_load_from_cache(name, "config.json", cache_dir=hub_cache(),
                                        revision=cfg.model.revision)
        if isinstance(cached, str):
            return json.loads(Path(cached).read_text()), Path(cached).parent, cached
    raise FileNotFoundError(f"model.target '{name}': no config.json found without downloading (not a local "
                            "folder, a prepared preset, or a Hub id in the HF cache); pass its config.json "
                            "with --target-config FILE, or a vendored one by name (e.g. --target-config "
                            "llama-3.1-8b)")


@contextlib.contextmanager
def meta_copies():
    """Drafter builders copy target weights with `.cpu()`; on the meta device that copy is the tensor
    itself."""
    import torch

    original = torch.Tensor.cpu
    torch.Tensor.cpu = lambda self, *a, **k: self if self.is_meta else original(self, *a, **k)
    try:
        yield
    finally:
        torch.Tensor.cpu = original


def build_on_meta(cfg, config: dict):
    """(target, drafter) built on the meta device from the target's config.json: shapes and counts, no
    memory."""
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    from draftsmith.heads.registry import build_drafter

    hf = AutoConfig.for_model(**config)
    with torch.device("meta"):
        target = AutoModelForCausalLM.from_config(hf)
    vocab = target.get_output_embeddings().weight.shape[0]
    drafter = None
    if cfg.drafter.spec.trainable:
        counts = torch.ones(vocab)  # on the CPU: a reduced draft vocabulary is chosen from real counts
        with init_empty_weights(include_buffers=True), meta_copies():
            drafter = build_drafter(cfg.drafter, target, counts)
    return target, drafter


def count_tokens(cfg, folder: Path | None, max_length) -> dict:
    """Tokens per epoch of the recipe's data with the target's tokenizer (each cut at data.max_length when
    fixed)."""
    from draftsmith.distill.records import load_records

    if folder is None:
        return {"tokens": None, "why": "no tokenizer beside the target's config.json: tokens not counted"}
    try:
        from transformers import AutoTokenizer

        from draftsmith.distill.data import render_chat, with_system
        from draftsmith.distill.target import apply_chat_template

        sources = [s for s in cfg.data.train if s != "regenerated"]
        if not sources:
            return {"tokens": None,
                    "why": "data.train is the target's regenerated answers: they do not exist yet"}
        records, _ = load_records(sources, limit=cfg.data.limit)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            apply_chat_template(tokenizer, cfg.model.chat_template, cfg.model.target,
                                cfg.model.chat_template_kwargs)
        lengths = [len(render_chat(tokenizer, with_system(r["messages"], cfg.data.system_prompt),
                                   False)) for r in records]
    except (FileNotFoundError, ValueError, OSError) as exc:
        return {"tokens": None, "why": f"the data could not be read ({exc})"}
    cut = max_length if isinstance(max_length, int) else None
    tokens = sum(min(n, cut) if cut else n for n in lengths)
    return {"tokens": tokens, "conversations": len(lengths), "longest": max(lengths, default=0),
            "why": f"{len(lengths)} conversations tokenised" + (f", each cut at {cut}" if cut else "")}


def size_recipe(cfg, target_config_path: str | None = None, num_processes: int = 1,
                count_data: bool = True) -> dict:
    """Every figure of the module doc for `cfg` on `num_processes` data-parallel processes (a JSON-ready
    dict)."""
    from draftsmith.distill.extract import STORAGE_DTYPES, bytes_per_token

    config, folder, source = target_config(cfg, target_config_path)
    target, drafter = build_on_meta(cfg, config)
    text = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
    hidden, vocab, layers = int(text.hidden_size), int(target.get_output_embeddings().weight.shape[0]), \
        int(text.num_hidden_layers)
    # the feature keys the extract stage stores (train/pipeline.py run_extract_stage)
    keys = list(dict.fromkeys([*cfg.drafter.settings.feature_layers(text), *cfg.extract.layers]))
    per_token = bytes_per_token(SimpleNamespace(config=target.config), keys, cfg.extract)

    mixed = cfg.train.mixed_precision if cfg.train.mixed_precision != "auto" else "bf16"
    model_dtype = cfg.model.dtype if cfg.model.dtype != "auto" else "bfloat16"
    s_t, act = DTYPE_BYTES[model_dtype], 2 if mixed in ("bf16", "fp16") else 4
    max_length = cfg.data.max_length
    data = count_tokens(cfg, folder, max_length) if count_data else {"tokens": None, "why": "not counted"}
    seq = max_length if isinstance(max_length, int) else (data.get("longest") or 2048)
    micro_tokens = cfg.train.batch_size * seq

    p_target = sum(p.numel() for p in target.parameters())
    p_train, p_frozen, width, drafter_layers = drafter_counts(drafter, text, hidden)
    steps = int(getattr(cfg.drafter.settings, "ttt_steps", 1) or 1)
    online = not cfg.extract.enabled
    per_token_act = {
        "target logits": vocab * (s_t + 4) if online else 0,
        "target features": len(keys) * hidden * (s_t if online else 4),
        "drafter logits": steps * width * 4 * 2,
        "drafter layers": steps * drafter_layers * 17 * hidden * act,
    }
    activations = micro_tokens * sum(per_token_act.values())
    n = max(1, num_processes)
    # bytes per trainable param: (whole, sharded)
    shards = {"ddp": (16, 0), "zero2": (4, 12), "zero3/fsdp": (0, 16)}
    memory = {}
    for mode, (whole, sharded) in shards.items():
        states = p_train * (whole + sharded / n)
        weights = p_target * s_t if online else 0
        memory[mode] = {"target": weights / GB, "drafter+optimizer": (states + p_frozen * 4) / GB,
                        "activations": activations / GB,
                        "total": (weights + states + p_frozen * 4 + activations) / GB}
    tokens = data.get("tokens")
    return {
        "recipe": cfg.name,
        "target": Path(target_config_path).stem if target_config_path else cfg.model.target,
        "target_config": source,
        "target_shape": {"architectures": config.get("architectures"), "hidden_size": hidden,
                         "layers": layers, "heads": getattr(text, "num_attention_heads", None),
                         "kv_heads": getattr(text, "num_key_value_heads", None),
                         "intermediate_size": getattr(text, "intermediate_size", None), "vocab_size": vocab,
                         "tied_embeddings": bool(getattr(target.config, "tie_word_embeddings", False)),
                         "parameters": p_target},
        "drafter": {"kind": cfg.drafter.kind, "trainable_parameters": p_train, "frozen_parameters": p_frozen,
                    "logit_width": width, "layers": drafter_layers, "unrolled_steps": steps},
        "features": {"keys": [str(k) for k in keys], "dtype": cfg.extract.dtype,
                     "dtype_bytes": STORAGE_DTYPES[cfg.extract.dtype].itemsize,
                     "top_k_logits": cfg.extract.top_k_logits, "bytes_per_token": per_token,
                     "gb_per_million_tokens": per_token * 1e6 / GB,
                     "gb_total": per_token * tokens / GB if tokens else None},
        "memory": {"mode": "online" if online else "offline (features from disk: no target on the GPU)",
                   "num_processes": n, "model_dtype": model_dtype, "mixed_precision": mixed,
                   "micro_batch_tokens": micro_tokens, "sequence_length": seq,
                   "activation_bytes_per_token": per_token_act, "gb": memory},
        "data": data,
        "assumptions": [
            f"target weights at model.dtype {model_dtype} (auto: bfloat16, a GPU with bf16)",
            "drafter trained in fp32 with AdamW: 16 B per trainable parameter (4 weights, 4 grads, 8 "
            "moments); frozen drafter parameters 4 B",
            f"activations: {cfg.train.batch_size} x {seq} tokens per micro-batch, mixed precision {mixed}; "
            "logits kept in fp32 with their log-softmax; no activation checkpointing; the CUDA context "
            "(~0.5-1 GB) not counted",
        ],
    }


def drafter_counts(drafter, text, hidden: int) -> tuple[int, int, int, int]:
    """The drafter built on meta (None: a kind without a module): its trainable and frozen parameters, its
    vocabulary-wide output width W (its `lm_head` Linear layers, and any wider than the target's MLP) and its
    decoder layers L, as the module doc's formulas use them."""
    import torch

    if drafter is None:
        return 0, 0, 0, 0
    mlp = int(getattr(text, "intermediate_size", 0) or 4 * hidden)
    trained = sum(p.numel() for p in drafter.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in drafter.parameters() if not p.requires_grad)
    width = sum(m.out_features for name, m in drafter.named_modules() if isinstance(m, torch.nn.Linear)
                and (name.endswith("lm_head") or m.out_features > max(mlp, 4 * hidden)))
    layers = sum(1 for m in drafter.modules() if type(m).__name__.endswith("Layer"))
    return trained, frozen, width, layers


def format_size(s: dict) -> str:
    """The figures as a short report (what `draftsmith size` prints without --json)."""
    t, d, f, m = s["target_shape"], s["drafter"], s["features"], s["memory"]
    lines = [f"recipe {s['recipe']}: target {s['target']} ({s['target_config']})",
             f"  target: {', '.join(t['architectures'] or ['?'])}, H {t['hidden_size']}, {t['layers']} "
             f"layers, {t['heads']} heads ({t['kv_heads']} KV), MLP {t['intermediate_size']}, vocab "
             f"{t['vocab_size']}, {t['parameters'] / 1e9:.2f}B parameters" + (" (tied embeddings)"
                                                                              if t["tied_embeddings"]
                                                                              else ""),
             f"  drafter {d['kind']}: {d['trainable_parameters'] / 1e6:,.1f}M trainable, "
             f"{d['frozen_parameters'] / 1e6:,.1f}M frozen",
             "",
             f"feature disk (offline training, extract.*): features {f['keys']} x H x {f['dtype_bytes']} B + "
             f"top-{f['top_k_logits']} x ({f['dtype_bytes']} + 4) + 5 = {f['bytes_per_token']:,} B/token = "
             f"{f['gb_per_million_tokens']:.2f} GB per 10^6 tokens"
             + (f"; {f['gb_total']:.2f} GB for this data" if f["gb_total"] is not None else "")]
    data = s["data"]
    lines.append(f"tokens per epoch: {data['tokens']:,} ({data['why']})" if data.get("tokens") is not None
                 else f"tokens per epoch: unknown ({data['why']})")
    lines += ["", f"GPU memory per process, {m['mode']}, {m['num_processes']} process(es), micro-batch "
                  f"{m['micro_batch_tokens']:,} tokens (GB):",
              f"  {'mode':<11} {'target':>8} {'drafter+opt':>12} {'activations':>12} {'total':>8}"]
    for mode, g in m["gb"].items():
        lines.append(f"  {mode:<11} {g['target']:>8.1f} {g['drafter+optimizer']:>12.1f} "
                     f"{g['activations']:>12.1f} {g['total']:>8.1f}")
    act = ", ".join(f"{k} {v:,}" for k, v in m["activation_bytes_per_token"].items())
    lines += [f"  activation bytes per token: {act}", "assumptions:"] + [f"  - {a}" for a in s["assumptions"]]
    return "\n".join(lines)
