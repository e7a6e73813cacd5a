"""Data as people have it -> one record shape: `{id, category, messages: [{role, content}, ...]}`.

First stop of the data flow (regeneration reads prompts from here, `distill/data.py` tokenises the
conversations). A source is

    a vendored name   spec-bench, mt-bench, train-general, train-gpteacher, smollm2-selfdistill-4k,
                      smollm2-selfdistill-extra (distill/corpora/, licenses in corpora/LICENSES.md)
    a file            .jsonl / .jsonl.gz (parsed line by line: one bad line costs one record, never the
                      file), .json, .parquet, .arrow, .txt (one prompt per line)
    a glob or folder  every supported file it matches, in name order; a folder written by
                      `Dataset.save_to_disk` is loaded as that dataset
    a dataset         `{path, name, split, data_files}` (a mapping in the config) or a Hub dataset id,
                      through `datasets.load_dataset` (local, or from the HF cache)

Record formats (each record may use any of them):

    OpenAI / SpecForge  `messages` | `conversation` | `conversations`: [{role, content}]
    ShareGPT            `conversations`: [{from: human|user|gpt|assistant|chatgpt|bard|system, value}]
    Alpaca              `instruction` (+ `input`), `output` (absent or empty: a prompt)
    prompts             `turns: [..]` | `prompt: ".."` | `question` (Spec-Bench, MT-bench)

A record that fits none, has an unknown role or an empty turn is skipped and counted in `DataStats`
with its reason and where it was (file:line), never a crash mid-run.
"""

from __future__ import annotations

import glob
import gzip
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from draftsmith.distill.cache import brief

CORPORA = Path(__file__).resolve().parent / "corpora"
NAMED_SOURCES = {
    "spec-bench": "spec_bench_questions.jsonl.gz",
    "mt-bench": "mt_bench_questions.jsonl.gz",
    "train-general": "train_prompts_general.jsonl.gz",
    "train-gpteacher": "train_prompts_gpteacher.jsonl.gz",
    "smollm2-selfdistill-4k": "smollm2_selfdistill_4k.jsonl.gz",
    "smollm2-selfdistill-extra": "smollm2_selfdistill_extra.jsonl.gz",
}
FILE_TYPES = (".jsonl", ".jsonl.gz", ".json", ".parquet", ".arrow", ".txt")
# An assistant turn's reasoning, kept for the template to render: `reasoning_content` (Qwen3, DeepSeek-R1,
# vLLM's reasoning parsers), `thinking` (gpt-oss's harmony template)
THINKING_KEYS = ("reasoning_content", "thinking")
ROLES = {"system": "system", "user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant",
         "chatgpt": "assistant", "bard": "assistant", "bing": "assistant", "model": "assistant"}


@dataclass
class DataSource:
    """A dataset read through `datasets.load_dataset(path, name, split=split, data_files=data_files)`."""

    path: str
    name: str | None = None
    split: str = "train"
    data_files: list[str] | None = None

    @property
    def label(self) -> str:
        return f"{self.path}{f'/{self.name}' if self.name else ''}[{self.split}]"


@dataclass
class DataStats:
    read: int = 0
    kept: int = 0
    malformed: int = 0  # unparsable line, wrong field types, unknown roles
    empty: int = 0  # no text in a turn / no assistant tokens left
    truncated: int = 0  # longer than max_length, cut
    max_length: int = 0  # the length rows were cut to (data.max_length, or what `auto` chose)
    # how it was chosen: "data.max_length" or "p99 of 30 conversations[, capped ...]"
    max_length_from: str = ""
    measured: int = 0  # conversations whose tokenised length was measured (the truncated share's denominator)
    reasons: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)  # reason -> where (first few)
    cache: str = ""  # the tokenised cache: "hit <folder>" or "written <folder>" (distill/data.py)
    validation: str = ""  # where validation came from when data.validation names it (distill/data.py)

    def skip(self, kind: str, reason: str, where: str | None = None) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        self.reasons[reason] = self.reasons.get(reason, 0) + 1
        if where is not None and len(self.examples.setdefault(reason, [])) < 3:
            self.examples[reason].append(where)

    def summary(self) -> str:
        s = f"{self.kept}/{self.read} records kept, {self.malformed} malformed, {self.empty} empty"
        s += "" if self.max_length else f", {self.truncated} truncated"  # else the length line says it
        named = [f"{k}: {v}" + (f" (e.g. {self.examples[k][0]})" if self.examples.get(k) else "")
                 for k, v in self.reasons.items()]
        s += f" ({', '.join(named)})" if named else ""
        s += f"; {self.length_line()}" if self.max_length else ""
        s += f"; validation: {self.validation}" if self.validation else ""
        return s + (f"; tokenised cache {self.cache}" if self.cache else "")

    def length_line(self) -> str:
        """`max_length 1024 (p99 of 30 conversations); 0 of 30 truncated`."""
        return (f"max_length {self.max_length} ({self.max_length_from}); {self.truncated} of {self.measured} "
                "truncated")

    def first_reason(self) -> str:
        if not self.reasons:
            return "no records"
        reason = next(iter(self.reasons))
        return reason + (f" at {self.examples[reason][0]}" if self.examples.get(reason) else "")

    def to_dict(self) -> dict:
        return asdict(self)


def _supported(path: Path) -> bool:
    return path.name.lower().endswith(FILE_TYPES)


def resolve_source(source) -> list[Path] | DataSource:
    """A source -> the files it names (in order), or a dataset for `load_dataset`."""
    if isinstance(source, DataSource):
        return source
    if isinstance(source, dict):
        return DataSource(**source)
    if source in NAMED_SOURCES:
        return [CORPORA / NAMED_SOURCES[source]]
    path = Path(source).expanduser()
    if path.is_file():
        return [path]
    if path.is_dir():
        if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
            return DataSource(path=str(path), split="train")  # a `save_to_disk` folder
        files = sorted(p for p in path.rglob("*") if p.is_file() and _supported(p))
        if not files:
            raise FileNotFoundError(f"data source '{source}': a folder with no data file "
                                    f"({', '.join(FILE_TYPES)})")
        return files
    if any(ch in str(source) for ch in "*?["):
        files = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if _supported(Path(p)))
        if not files:
            raise FileNotFoundError(f"data source '{source}': the pattern matches no data file "
                                    f"({', '.join(FILE_TYPES)})")
        return files
    if "/" in str(source) and not str(source).startswith((".", "/",
                                                          "~")) and len(str(source).split("/")) == 2:
        return DataSource(path=str(source))  # a Hub dataset id (from the cache when offline)
    raise FileNotFoundError(f"data source '{source}' is neither a file, a folder, a glob, a dataset id "
                            f"(org/name) nor a vendored name ({', '.join(NAMED_SOURCES)}); looked for "
                            f"{path.absolute()}")


def _read_jsonl(path: Path, stats: DataStats):
    """(where, raw record) of each line; a line that is not JSON (or not UTF-8) is counted, not fatal."""
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rb") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path.name}:{number}"
            try:
                yield where, json.loads(line.decode("utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError):
                stats.read += 1
                stats.skip("malformed", "invalid json or utf-8", where)


def _load_dataset(source: DataSource):
    import datasets

    if Path(source.path).is_dir() and ((Path(source.path) / "state.json").is_file()
                                       or (Path(source.path) / "dataset_dict.json").is_file()):
        loaded = datasets.load_from_disk(source.path)
        return loaded[source.split] if isinstance(loaded, datasets.DatasetDict) else loaded
    try:
        return datasets.load_dataset(source.path, source.name, split=source.split,
                                     data_files=source.data_files)
    except Exception as exc:  # not cached offline, unknown id, bad split: name it and the fix
        raise FileNotFoundError(f"data source {source.label}: `datasets.load_dataset` failed "
                                f"({type(exc).__name__}: {brief(exc)}); check the path, name and split, or "
                                "download the dataset once where the hub is reachable (HF_HOME / "
                                "HF_DATASETS_OFFLINE)") from None


def read_raw(source, stats: DataStats):
    """(where, raw record) of every record of one source, in order."""
    resolved = resolve_source(source)
    if isinstance(resolved, DataSource):
        for i, row in enumerate(_load_dataset(resolved)):
            yield f"{resolved.label}:{i}", row
        return
    for path in resolved:
        name = path.name.lower()
        if name.endswith((".jsonl", ".jsonl.gz")):
            yield from _read_jsonl(path, stats)
        elif name.endswith(".txt"):
            for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                if line.strip():
                    yield f"{path.name}:{number}", {"prompt": line}
        elif name.endswith((".json", ".parquet", ".arrow")):
            for i, row in enumerate(_load_file(path)):
                yield f"{path.name}:{i}", row
        else:
            raise ValueError(f"{path}: unsupported data file type (use {', '.join(FILE_TYPES)})")


def _load_file(path: Path):
    import datasets

    name = path.name.lower()
    if name.endswith(".arrow"):
        return datasets.Dataset.from_file(str(path))
    if name.endswith(".parquet"):
        return datasets.load_dataset("parquet", data_files=str(path), split="train")
    try:
        head = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:  # JSON Lines under a .json name: datasets reads those too
        head = None
    if isinstance(head, list):
        return head
    if isinstance(head, dict):  # {"data": [...]}-style files
        key = next((k for k, v in head.items() if isinstance(v, list)), None)
        if key is None:
            raise ValueError(f"{path}: a JSON file must hold a list of records (or a dict with one)")
        return head[key]
    return datasets.load_dataset("json", data_files=str(path), split="train")


def _first(raw: dict, *keys: str):
    """The first of `keys` whose value is not None (datasets fills a file's missing columns with None)."""
    return next((raw[k] for k in keys if raw.get(k) is not None), None)


def _turns(raw: dict) -> tuple[list[dict] | None, str | None]:
    """(messages, None) for a record of any supported format, or (None, the reason it fits none)."""
    convo = _first(raw, "messages", "conversation", "conversations")
    if convo is not None:
        if not isinstance(convo, list) or not all(isinstance(m, dict) for m in convo):
            return None, "bad conversation"
        messages = []
        for m in convo:
            role, content = _first(m, "role", "from"), _first(m, "content", "value")
            if not isinstance(content, str):
                return None, "bad conversation"
            if not isinstance(role, str) or role.lower() not in ROLES:
                return None, f"unknown role {role!r}"
            messages.append({"role": ROLES[role.lower()], "content": content})
            if messages[-1]["role"] == "assistant":  # a reasoning model's thinking, as its template names it
                messages[-1].update({k: m[k] for k in THINKING_KEYS if isinstance(m.get(k), str)})
        return messages, None
    if isinstance(raw.get("instruction"), str):  # Alpaca
        prompt = raw["instruction"] + (f"\n\n{raw['input']}" if isinstance(raw.get("input"),
                                                                           str) and raw["input"].strip()
                                       else "")
        output = raw.get("output")
        answer = [{"role": "assistant", "content": output}] if isinstance(output,
                                                                          str) and output.strip() else []
        return [{"role": "user", "content": prompt}, *answer], None
    turns = _first(raw, "turns", "prompt", "question")
    turns = [turns] if isinstance(turns, str) else turns
    if not isinstance(turns, list) or not all(isinstance(t, str) for t in turns):
        return None, "no text column (messages, conversations, instruction, turns or prompt)"
    return [{"role": "user", "content": t} for t in turns], None


def normalize_record(raw, index: int, stats: DataStats, source: str, where: str | None = None) -> dict | None:
    """Any supported record -> {id, category, messages}; None (counted, with where it was) when unusable."""
    stats.read += 1
    where = where or f"{Path(str(source)).name}:{index}"
    if not isinstance(raw, dict):
        stats.skip("malformed", "not an object", where)
        return None
    rid = _first(raw, "id", "question_id")
    rid = f"{Path(str(source)).name}:{index}" if rid is None else str(rid)
    messages, reason = _turns(raw)
    if messages is None:
        stats.skip("malformed", reason, where)
        return None
    if not messages or any(not m["content"].strip() for m in messages if m["role"] != "system"):
        stats.skip("empty", "empty turn", where)
        return None
    stats.kept += 1
    return {"id": rid, "category": str(raw.get("category") or ""), "messages": messages}


def load_records(sources, limit: int | None = None, stats: DataStats | None = None,
                 categories: list[str] | None = None) -> tuple[list[dict], DataStats]:
    """Read and normalise records from every source, in order; skip (and count) bad ones. A source with no
    usable record at all is an error naming it and the first reason."""
    stats = stats or DataStats()
    sources = [sources] if isinstance(sources, (str, dict, DataSource)) else sources
    out: list[dict] = []
    for source in sources:
        before = stats.kept
        for i, (where, raw) in enumerate(read_raw(source, stats)):
            rec = normalize_record(raw, i, stats, source if isinstance(source, str) else "dataset", where)
            if rec is None or (categories and rec["category"] not in categories):
                continue
            out.append(rec)
            if limit is not None and len(out) >= limit:
                return out, stats
        if stats.kept == before:
            raise ValueError(f"data source '{source}' has no usable record ({stats.summary()}); first "
                             f"reason: {stats.first_reason()}. The formats read are listed in "
                             "distill/records.py")
    return out, stats
