"""Bad-input fuzz: every input kind tried, each outcome classified; the table as JSON.

    python scripts/dev/fuzz.py OUT.json [--seed 0] [--per-kind 25]

Outcomes: `clear` (refused with draftsmith's own error naming the problem), `counted` (bad records
skipped and counted with where they were; the good ones all kept), `crash` (any other exception: a
bug), `silent drop` (a record neither kept nor counted, or a bad one kept: a bug). Goal: 0 crashes,
0 silent drops. Kinds:

    data       files mixing good conversations with: invalid UTF-8, binary garbage, huge lines, empty
               turns, wrong roles, wrong field types, 100k-token prompts, truncated JSON
    config     wrong types, unknown keys, missing files, bad enum values, moved keys
    drafter    drafter folders with missing / extra / renamed tensors, wrong shapes, wrong dtypes,
               a drafter for another target (vocab, hidden size, tokenizer), a bad draftsmith.json
    export     exports (eagle3, medusa) with the same damage, read back by eval --drafter
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

from draftsmith.eval.measure.campaign import load_file

ROOT = Path(__file__).resolve().parents[2]


def tests_helpers():
    """tests/helpers.py (the tests' tiny tokenizer and target), loaded from its file: test code, not package
    code."""
    return load_file(ROOT / "tests" / "helpers.py")


def good(i: int) -> dict:
    return {"id": f"g{i}", "conversation": [{"role": "user", "content": f"question {i}"},
                                            {"role": "assistant", "content": f"answer {i} " * 3}]}


BAD_LINES = {
    "invalid utf-8": lambda rng: b'{"id": "x", "conversation": [{"role": "user", "content": "\xff\xfe"}]}',
    "binary garbage": lambda rng: bytes(rng.randrange(256)
                                        for _ in range(rng.randrange(1, 400))).replace(b"\n", b""),
    "huge line": lambda rng: json.dumps({"id": "h",
                                         "conversation": [{"role": "user", "content": "x" * 2_000_000},
                                                                     {"role": "assistant",
                                                                      "content": ""}]}).encode(),
    "empty turns": lambda rng: json.dumps({"id": "e", "conversation": [{"role": "user", "content": ""},
                                                                       {"role": "assistant",
                                                                        "content": ""}]}).encode(),
    "wrong roles": lambda rng: json.dumps({"id": "r", "conversation": [{"role": "wizard", "content": "hi"},
                                                                       {"role": "oracle",
                                                                        "content": "ho"}]}).encode(),
    "wrong field types": lambda rng: json.dumps(rng.choice([
        {"id": 1, "conversation": "not a list"}, {"conversation": [{"role": "user", "content": 5}]},
        {"messages": {"role": "user"}}, [1, 2, 3], "a string", None, 7])).encode(),
    "100k-token prompt": lambda rng: json.dumps({"id": "long", "conversation": [
        {"role": "user", "content": "word " * 100_000}, {"role": "assistant", "content": "ok"}]}).encode(),
    "truncated json": lambda rng: json.dumps(good(0))[: rng.randrange(1, 40)].encode(),
}


def classify_data(tokenizer, tmp: Path, rng: random.Random, kind: str) -> dict:
    from draftsmith.distill.data import DataConfig, build_datasets

    goods = [good(i) for i in range(rng.randrange(3, 8))]
    lines = [json.dumps(g).encode() for g in goods] + [BAD_LINES[kind](rng)
                                                       for _ in range(rng.randrange(1, 4))]
    rng.shuffle(lines)
    path = tmp / f"data-{rng.randrange(10**9)}.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    try:
        train, val, stats = build_datasets(DataConfig(train=[str(path)], val_fraction=0.0, max_length=256,
                                                      cache=False),
                                           tokenizer, {2})
    except ValueError as exc:
        return {"outcome": "clear", "message": str(exc)[:200]}
    except Exception as exc:  # noqa: BLE001 - the point is to find these
        return {"outcome": "crash", "message": f"{type(exc).__name__}: {exc}"[:300]}
    kept_ids = set(train["id"]) | set(val["id"])
    accounted = stats.kept + stats.malformed + stats.empty == stats.read
    all_good_kept = {g["id"] for g in goods} <= kept_ids
    # a 100k prompt is kept, truncated, if it fits
    only_good = kept_ids <= {g["id"] for g in goods} | {"long"}
    if not (accounted and all_good_kept and only_good):
        return {"outcome": "silent drop", "message": stats.summary()[:300]}
    return {"outcome": "counted", "message": stats.summary()[:200]}


CONFIG_CASES = [
    ["train.lr=fast"], ["train.batch_size=1.5"], ["train.nonsense=1"], ["nosection.x=1"],
    ["drafter.kind=wizard"], ["model.dtype=float8"], ["train.schedule=sideways"],
    ["drafter.medusa.heads=-1"], ["eval.limit=many"], ["train.deepspeed=/no/such.json"],
    ["data.val_fraction=1.5"], ["medusa_heads=3"], ["drafter.eagle3.aux_layers=[1,2]"], ["log.wandb=maybe"],
    ["extract.on_corrupt=ignore"],
    ["data.regenerate.backend=grpc"], ["train.max_steps=-3"], ["data.limit=x"], ["model.max_memory=5"],
]


MISSING_FILE_CASES = [["train", "data.train=[/no/such/file.jsonl]"], ["train", "model.target=/no/such/model"],
                      ["train", "-c", "/no/such/recipe.yaml"],
                      ["eval", "--drafter", "/no/such/drafter", "--limit", "1"],
                      ["export", "--run", "/no/such/run", "--format", "eagle3", "--out", "/tmp/never"]]


def classify_config(case: list[str], tmp: Path, command: str = "config") -> dict:
    """`draftsmith config` for types and keys; `draftsmith train` for files (refused before any work)."""
    import subprocess

    if command != "config":
        command, case = case[0], case[1:]
    out = ["--out", str(tmp / "cfg-run")] if command in ("train", "eval") else []
    cmd = [sys.executable, "-m", "draftsmith.train", command, *out, *case]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    if r.returncode == 0:
        return {"outcome": "silent drop", "message": f"accepted: {case}"}
    last = (r.stderr.strip().splitlines() or [""])[-1]
    if last.startswith(f"draftsmith {command}: error:") or "error:" in last and "Traceback" not in r.stderr:
        return {"outcome": "clear", "message": last[:200]}
    return {"outcome": "crash", "message": r.stderr[-300:]}


def damaged_folders(src: Path, tmp: Path, rng: random.Random, kind: str):
    """Copies of a drafter/export folder with one kind of damage; yields (label, folder)."""
    import torch
    from safetensors.torch import load_file as load_weights
    from safetensors.torch import save_file

    weights = sorted([*src.glob("*.safetensors"), *src.glob("*.pt")])[0]
    tensors = load_weights(
        str(weights)) if weights.suffix == ".safetensors" else torch.load(weights, weights_only=True)
    names = sorted(tensors)
    for n in range(3):
        out = tmp / f"{kind}-{rng.randrange(10**9)}"
        shutil.copytree(src, out)
        t = dict(tensors)
        name = rng.choice(names)
        if kind == "missing tensor":
            t.pop(name)
        elif kind == "extra tensor":
            t[f"extra.{n}.weight"] = torch.zeros(3, 3)
        elif kind == "renamed tensor":
            t[name.replace(".", "_", 1) + "_renamed"] = t.pop(name)
        elif kind == "wrong shape":
            t[name] = torch.zeros(*[d + 1 for d in t[name].shape]) if t[name].dim() else torch.zeros(2)
        elif kind == "wrong dtype":
            t[name] = t[name].to(torch.int32) if t[name].is_floating_point() else t[name].float()
        elif kind == "bad meta":
            meta = out / "draftsmith.json"
            if meta.is_file():
                meta.write_text(rng.choice(['{"kind": "wizard"}', "not json",
                                            '{"kind": "medusa", "target": 5}',
                                            '{"kind": "medusa", "tree": "../../etc/passwd"}']))
            else:
                (out / "config.json").write_text("not json")
        if weights.suffix == ".safetensors":
            save_file({k: v.contiguous() for k, v in t.items()}, str(out / weights.name),
                      metadata={"format": "pt"})
        else:
            torch.save(t, out / weights.name)
        yield f"{kind}: {name}", out


def classify_folder(target, folder: Path) -> dict:
    from draftsmith.eval.serving import build_proposer
    from draftsmith.heads.registry import DrafterConfig

    try:
        build_proposer(DrafterConfig(path=str(folder)), target)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        msg = str(exc)
        return {"outcome": "clear" if len(msg) > 20 else "crash", "message": msg[:200]}
    except Exception as exc:  # noqa: BLE001
        return {"outcome": "crash", "message": f"{type(exc).__name__}: {exc}"[:300]}
    return {"outcome": "silent drop", "message": "loaded a damaged folder"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-kind", type=int, default=25)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    tokenizer = tests_helpers().build_tiny_tokenizer()
    from datasets.utils.logging import disable_progress_bar

    disable_progress_bar()
    table: dict[str, Counter] = {}
    examples: dict[str, list] = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)

        def note(group: str, kind: str, result: dict) -> None:
            key = f"{group}: {kind}"
            table.setdefault(key, Counter())[result["outcome"]] += 1
            if result["outcome"] in ("crash", "silent drop") or len(examples.setdefault(key, [])) < 1:
                examples.setdefault(key, []).append(result["message"])

        for kind in BAD_LINES:
            for _ in range(args.per_kind):
                note("data", kind, classify_data(tokenizer, tmp, rng, kind))
        for case in CONFIG_CASES:
            note("config", case[0].split("=")[0], classify_config(case, tmp))
        for case in MISSING_FILE_CASES:
            note("missing file", " ".join(case)[:48], classify_config(case, tmp, "any"))
        folders = drafter_folders(tmp)
        target = folders.pop("target")
        for label, src in folders.items():
            for kind in ("missing tensor", "extra tensor", "renamed tensor", "wrong shape", "wrong dtype",
                         "bad meta"):
                for _, folder in damaged_folders(src, tmp, rng, kind):
                    note(label, kind, classify_folder(target, folder))
            for other, folder in foreign_target_folders(src, tmp).items():
                note(label, f"drafter for another target ({other})", classify_folder(target, folder))
    rows = [{"input": k, "tried": sum(c.values()),
             **{o: c.get(o, 0) for o in ("clear", "counted", "crash", "silent drop")},
             "example": examples.get(k, [""])[0]} for k, c in table.items()]
    result = {"seed": args.seed, "tried": sum(r["tried"] for r in rows),
              "crashes": sum(r["crash"] for r in rows), "silent_drops": sum(r["silent drop"] for r in rows),
              "rows": rows,
              "problems": {k: v for k, v in examples.items() if table[k]["crash"] or table[k]["silent drop"]}}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for r in rows:
        print(f"{r['input']:60s} tried {r['tried']:3d}  clear {r['clear']:3d}  counted {r['counted']:3d}  "
              f"crash {r['crash']:2d}  silent {r['silent drop']:2d}")
    print(f"total {result['tried']} tried, {result['crashes']} crashes, {result['silent_drops']} silent "
          "drops")


def drafter_folders(tmp: Path) -> dict:
    """A tiny target, and a trained-shape folder of each kind (+ its serving exports) for it."""
    import torch

    from draftsmith.distill.loading import load_target
    from draftsmith.heads.export import export_drafter
    from draftsmith.heads.folder import read_folder
    from draftsmith.heads.registry import DrafterConfig, build_drafter

    folder = tests_helpers().build_tiny_model_dir(tmp, "llama", layers=4)
    target = load_target(str(folder))
    out = {"target": target}
    for kind, extra in (("medusa", {}), ("eagle", {}),
                        ("eagle3", {"draft_vocab": 0, "aux_layers": [1, 2, 3]})):
        torch.manual_seed(0)
        d = build_drafter(DrafterConfig.for_kind(kind, **extra), target.model)
        path = tmp / f"drafter-{kind}"
        d.save_pretrained(path, target=str(folder), tokenizer=target.tokenizer)
        out[f"drafter folder ({kind})"] = path
        fmt = {"medusa": "medusa", "eagle": "eagle", "eagle3": "eagle3"}[kind]
        exp = tmp / f"export-{fmt}"
        export_drafter(read_folder(path), fmt, exp, base_model=str(folder), dtype="float32",
                       target_model=target.model)
        out[f"export ({fmt})"] = exp
    return out


def foreign_target_folders(src: Path, tmp: Path) -> dict:
    """`src` as if made for targets that differ in vocabulary, hidden size or tokenizer."""
    out = {}
    # an export records no tokenizer (neither engine's layout has a field for it): only sizes can be checked
    for what in ("vocab", "hidden size",
                 "tokenizer") if (src / "draftsmith.json").is_file() else ("vocab", "hidden size"):
        dst = tmp / f"foreign-{what.replace(' ', '-')}-{src.name}"
        shutil.copytree(src, dst)
        meta_path = dst / "draftsmith.json"
        if meta_path.is_file():
            meta = json.loads(meta_path.read_text())
            sig = dict(meta.get("target_signature") or {})
            key = {"vocab": "vocab_size", "hidden size": "hidden_size", "tokenizer": "tokenizer"}[what]
            sig[key] = (sig.get(key) or 0) + 1 if key != "tokenizer" else "0123456789abcdef"
            meta["target_signature"] = sig
            meta_path.write_text(json.dumps(meta))
        else:
            cfg = json.loads((dst / "config.json").read_text())
            for key in ("vocab_size", "hidden_size", "target_hidden_size"):
                if key in cfg and what in ("vocab", "hidden size"):
                    cfg[key] = cfg[key] + 1 if (key == "vocab_size") == (what == "vocab") else cfg[key]
            (dst / "config.json").write_text(json.dumps(cfg))
        out[what] = dst
    return out


if __name__ == "__main__":
    main()
