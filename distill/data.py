"""Prompts and conversations -> tokenised training examples with assistant-only loss masks.

Second stop of the flow: regeneration reads prompts from here, extraction and training read
tokenised conversations. Sources are vendored names (`spec-bench`, `mt-bench`, `train-general`,
`train-gpteacher`, `smollm2-selfdistill-4k`; files in `distill/corpora/` with their licenses in
`distill/corpora/LICENSES.md`) or files: `.jsonl[.gz]`, `.json`, `.parquet`, loaded through
`datasets`. A record is a prompt (`turns: [..]` or `prompt: ".."`) or a conversation
(`conversation`/`messages`: [{role, content}, ...]). Malformed or empty records are skipped and
counted in `DataStats`, never a crash mid-run.

Output of `build_datasets`: two `datasets.Dataset`s (train, validation; split deterministically by
hashing each record's id) with columns `id`, `input_ids` [T] and `loss_mask` [T] (1 on assistant
tokens, up to and including the end-of-turn token).
"""

from __future__ import annotations

import gzip
import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

CORPORA = Path(__file__).resolve().parent / "corpora"
NAMED_SOURCES = {
    "spec-bench": "spec_bench_questions.jsonl.gz",
    "mt-bench": "mt_bench_questions.jsonl.gz",
    "train-general": "train_prompts_general.jsonl.gz",
    "train-gpteacher": "train_prompts_gpteacher.jsonl.gz",
    "smollm2-selfdistill-4k": "smollm2_selfdistill_4k.jsonl.gz",
}


@dataclass
class RegenerateConfig:
    """`data.regenerate:` — the target writes answers to these prompts (self-distillation)."""

    prompts: list[str] = field(default_factory=list)  # sources; empty = no regeneration stage
    out: str = ""  # output jsonl; empty = <run dir>/regenerated.jsonl
    limit: int | None = None  # first N usable prompts
    max_prompt_tokens: int = 768
    max_new_tokens: int = 256
    batch_size: int = 8
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0


@dataclass
class DataConfig:
    """`data:` section — what the drafter trains on."""

    train: list[str] = field(default_factory=lambda: ["smollm2-selfdistill-4k"])
    max_length: int = 1024
    val_fraction: float = 0.02
    limit: int | None = None  # use at most N conversations (after skipping bad records)
    system_prompt: str | None = None  # None: the chat template's default
    regenerate: RegenerateConfig = field(default_factory=RegenerateConfig)

    def __post_init__(self):
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"data.val_fraction must be in [0, 1), got {self.val_fraction}")


@dataclass
class DataStats:
    read: int = 0
    kept: int = 0
    malformed: int = 0  # unparsable line, wrong field types, unknown roles
    empty: int = 0  # no text in a turn / no assistant tokens left
    truncated: int = 0  # longer than max_length, cut
    reasons: dict[str, int] = field(default_factory=dict)

    def skip(self, kind: str, reason: str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        self.reasons[reason] = self.reasons.get(reason, 0) + 1

    def summary(self) -> str:
        s = f"{self.kept}/{self.read} records kept, {self.malformed} malformed, {self.empty} empty, {self.truncated} truncated"
        return s + (f" ({', '.join(f'{k}: {v}' for k, v in self.reasons.items())})" if self.reasons else "")

    def to_dict(self) -> dict:
        return asdict(self)


def resolve_source(source: str) -> Path:
    if source in NAMED_SOURCES:
        return CORPORA / NAMED_SOURCES[source]
    path = Path(source).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"data source '{source}' is neither a file nor a vendored name ({', '.join(NAMED_SOURCES)})")
    return path


def _read_raw(path: Path, stats: DataStats) -> list:
    """Raw records of one file. JSONL is parsed line by line so one broken line costs one record."""
    name = path.name.lower()
    if name.endswith((".jsonl", ".jsonl.gz")):
        opener = gzip.open if name.endswith(".gz") else open
        rows = []
        with opener(path, "rt", encoding="utf-8") as fh:
            for line in fh:
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    stats.read += 1
                    stats.skip("malformed", "invalid json")
        return rows
    if name.endswith((".json", ".parquet")):
        import datasets

        builder = "parquet" if name.endswith(".parquet") else "json"
        field_arg = {}
        if builder == "json":
            try:
                head = json.loads(path.read_text(encoding="utf-8"))
            except json.JSONDecodeError:  # JSON Lines under a .json name: datasets reads those too
                head = None
            if isinstance(head, dict):  # {"data": [...]}-style files
                key = next((k for k, v in head.items() if isinstance(v, list)), None)
                if key is None:
                    raise ValueError(f"{path}: a JSON file must hold a list of records (or a dict with one)")
                field_arg = {"field": key}
        return list(datasets.load_dataset(builder, data_files=str(path), split="train", **field_arg))
    raise ValueError(f"{path}: unsupported data file type (use .jsonl, .jsonl.gz, .json or .parquet)")


def _first(raw: dict, *keys: str):
    """The first of `keys` whose value is not None (datasets fills a file's missing columns with None)."""
    return next((raw[k] for k in keys if raw.get(k) is not None), None)


def normalize_record(raw, index: int, stats: DataStats, source: str) -> dict | None:
    """Any supported record -> {id, category, messages}; None (counted) when unusable."""
    stats.read += 1
    if not isinstance(raw, dict):
        stats.skip("malformed", "not an object")
        return None
    rid = _first(raw, "id", "question_id")
    rid = f"{Path(source).name}:{index}" if rid is None else str(rid)
    messages = _first(raw, "conversation", "messages")
    if messages is not None:
        if not isinstance(messages, list) or not all(
                isinstance(m, dict) and m.get("role") in ("system", "user", "assistant")
                and isinstance(m.get("content"), str) for m in messages):
            stats.skip("malformed", "bad conversation")
            return None
        messages = [{"role": m["role"], "content": m["content"]} for m in messages]
    else:
        turns = _first(raw, "turns", "prompt")
        turns = [turns] if isinstance(turns, str) else turns
        if not isinstance(turns, list) or not all(isinstance(t, str) for t in turns):
            stats.skip("malformed", "no turns/prompt")
            return None
        messages = [{"role": "user", "content": t} for t in turns]
    if not messages or any(not m["content"].strip() for m in messages if m["role"] != "system"):
        stats.skip("empty", "empty turn")
        return None
    stats.kept += 1
    return {"id": rid, "category": str(raw.get("category") or ""), "messages": messages}


def load_records(sources: list[str] | str, limit: int | None = None, stats: DataStats | None = None,
                 categories: list[str] | None = None) -> tuple[list[dict], DataStats]:
    """Read and normalise records from every source, in order; skip (and count) bad ones."""
    stats = stats or DataStats()
    sources = [sources] if isinstance(sources, str) else sources
    out: list[dict] = []
    for source in sources:
        path = resolve_source(source)
        for i, raw in enumerate(_read_raw(path, stats)):
            rec = normalize_record(raw, i, stats, source)
            if rec is None or (categories and rec["category"] not in categories):
                continue
            out.append(rec)
            if limit is not None and len(out) >= limit:
                return out, stats
    return out, stats


def render_chat(tokenizer, messages, add_generation_prompt: bool) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)


def with_system(messages: list[dict], system_prompt: str | None) -> list[dict]:
    if system_prompt is None or (messages and messages[0]["role"] == "system"):
        return messages
    return [{"role": "system", "content": system_prompt}, *messages]


def encode_conversation(tokenizer, messages: list[dict], eos_ids: set[int] | None = None) -> tuple[list[int], list[int]]:
    """Token ids of the whole chat and a mask that is 1 exactly on assistant-written tokens.

    Each assistant span is found by rendering the template up to the turn (with the generation
    prompt) and through it; the span runs to the end-of-turn token (inclusive) — template text
    after it (e.g. ChatML's newline) is not something the model generates, so it is not a target.
    `eos_ids` defaults to the tokenizer's eos token.
    """
    if eos_ids is None and tokenizer.eos_token_id is not None:
        eos_ids = {tokenizer.eos_token_id}
    ids = render_chat(tokenizer, messages, add_generation_prompt=False)
    mask = [0] * len(ids)
    for i, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        head = render_chat(tokenizer, messages[:i], add_generation_prompt=True)
        through = render_chat(tokenizer, messages[: i + 1], add_generation_prompt=False)
        # both renders must be prefixes of the whole chat (templates that inject a default system
        # turn only when messages is non-empty, or rewrite earlier turns, are not)
        if through != ids[: len(through)] or head != through[: len(head)]:
            raise ValueError("chat template is not prefix-stable; cannot locate assistant tokens")
        start, end = len(head), len(through)
        for j in range(start, end):
            mask[j] = 1
            if eos_ids and ids[j] in eos_ids:
                break
    return ids, mask


def split_of(record_id: str, val_fraction: float) -> str:
    """Deterministic split by id hash: the same record lands on the same side on every machine."""
    h = int(hashlib.sha256(record_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "validation" if h < val_fraction else "train"


def build_datasets(cfg: DataConfig, tokenizer, eos_ids: set[int] | None = None):
    """Tokenised (train, validation, stats) from `cfg.train`; conversations only (need answers)."""
    import datasets
    from jinja2 import TemplateError  # strict templates raise it (e.g. "roles must alternate")

    records, stats = load_records(cfg.train)
    rows = {"train": [], "validation": []}
    for rec in records:
        if not any(m["role"] == "assistant" for m in rec["messages"]):
            stats.skip("empty", "no assistant turn (run regenerate first)")
            continue
        try:
            ids, mask = encode_conversation(tokenizer, with_system(rec["messages"], cfg.system_prompt), eos_ids)
        except (ValueError, TemplateError):
            stats.skip("malformed", "template error")
            continue
        if len(ids) > cfg.max_length:
            stats.truncated += 1
            ids, mask = ids[: cfg.max_length], mask[: cfg.max_length]
        if sum(mask) == 0:
            stats.skip("empty", "no assistant tokens within max_length")
            continue
        rows[split_of(rec["id"], cfg.val_fraction)].append({"id": rec["id"], "input_ids": ids, "loss_mask": mask})
        if cfg.limit is not None and len(rows["train"]) + len(rows["validation"]) >= cfg.limit:
            break
    stats.kept = len(rows["train"]) + len(rows["validation"])
    empty = {"id": [], "input_ids": [], "loss_mask": []}
    make = lambda r: datasets.Dataset.from_list(r) if r else datasets.Dataset.from_dict(empty)  # noqa: E731
    return make(rows["train"]), make(rows["validation"]), stats


def label_counts(rows, vocab_size: int) -> torch.Tensor:
    """How often each token id is a trained label (loss_mask 1) in `rows`: `[V]` int64."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for row in rows:
        ids, mask = torch.as_tensor(row["input_ids"]), torch.as_tensor(row["loss_mask"]).bool()
        counts += torch.bincount(ids[mask], minlength=vocab_size)[:vocab_size]
    return counts
