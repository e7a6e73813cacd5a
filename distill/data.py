"""Conversations -> tokenised training examples with assistant-only loss masks (the `data:` section).

Second stop of the flow: `distill/records.py` reads the sources into one record shape; here every
conversation is rendered with the target's chat template and tokenised, the loss mask set to 1 exactly
on the assistant-written tokens (up to and including the end-of-turn token), and the rows split into
train / validation by a hash of each record's id (the same on every machine and run).

Tokenisation runs through `datasets.map` (`data.num_proc` workers) once per fingerprint of (the
records, the tokenizer, its chat template, max length, system prompt, split) and is saved under
`$DRAFTSMITH_HOME/tokenized/<key>/`: every later stage, rank and run with the same inputs loads it
memory-mapped instead of tokenising again (`DataStats.cache` says which happened). Output of
`build_datasets`: two `datasets.Dataset`s with columns `id`, `input_ids` [T] and `loss_mask` [T].
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from draftsmith.distill.cache import fingerprint, publish, scratch, tokenized_home
from draftsmith.distill.records import DataSource, DataStats, load_records

TOKENIZED_VERSION = 1


@dataclass
class RegenerateConfig:
    """`data.regenerate:` — the target writes answers to these prompts (self-distillation)."""

    prompts: list[str | DataSource] = field(default_factory=list)  # sources; empty = no regeneration stage
    out: str = ""  # output jsonl; empty = <run dir>/regenerated.jsonl
    limit: int | None = None  # first N usable prompts
    max_prompt_tokens: int = 768
    max_new_tokens: int = 256
    batch_size: int = 8
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    backend: Literal["hf", "openai"] = "hf"  # hf: the target's generate; openai: a /v1/completions server
    url: str = "http://127.0.0.1:8000/v1"  # openai: the server's base url (vLLM, SGLang, llama.cpp, TGI)
    model: str = ""  # openai: the served model's name ("" = the server's only model)
    concurrency: int = 8  # openai: requests in flight
    timeout: float = 120.0  # openai: seconds per request
    retries: int = 5  # openai: tries after the first, with exponential backoff
    backoff: float = 0.5  # openai: first wait in seconds (doubles each try)
    api_key_env: str = "OPENAI_API_KEY"  # openai: the environment variable holding the key, if any

    def __post_init__(self):
        if self.concurrency < 1 or self.batch_size < 1:
            raise ValueError("data.regenerate.concurrency and batch_size must be at least 1")


@dataclass
class DataConfig:
    """`data:` section — what the drafter trains on (sources and formats: distill/records.py)."""

    train: list[str | DataSource] = field(default_factory=lambda: ["smollm2-selfdistill-4k"])
    max_length: int = 1024
    val_fraction: float = 0.02
    limit: int | None = None  # use at most N conversations (after skipping bad records)
    system_prompt: str | None = None  # None: the chat template's default
    num_proc: int | None = None  # tokenisation workers; None: 1 for small sets, else up to 8
    cache: bool = True  # reuse (and write) the tokenised cache under $DRAFTSMITH_HOME/tokenized
    regenerate: RegenerateConfig = field(default_factory=RegenerateConfig)

    def __post_init__(self):
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"data.val_fraction must be in [0, 1), got {self.val_fraction}")


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


def _encode_row(record: dict, tokenizer, eos_ids, max_length: int, system_prompt: str | None) -> dict:
    """One record -> its row, or its reason for being skipped (`skip`) — what `datasets.map` runs."""
    from jinja2 import TemplateError  # strict templates raise it (e.g. "roles must alternate")

    out = {"id": record["id"], "input_ids": [], "loss_mask": [], "skip": "", "truncated": False}
    messages = json.loads(record["messages"])
    if not any(m["role"] == "assistant" for m in messages):
        return dict(out, skip="empty:no assistant turn (run regenerate first)")
    try:
        ids, mask = encode_conversation(tokenizer, with_system(messages, system_prompt), eos_ids)
    except (ValueError, TemplateError):
        return dict(out, skip="malformed:template error")
    if len(ids) > max_length:
        ids, mask, out["truncated"] = ids[:max_length], mask[:max_length], True
    if sum(mask) == 0:
        return dict(out, skip="empty:no assistant tokens within max_length")
    return dict(out, input_ids=ids, loss_mask=mask)


def _tokenise(records: list[dict], cfg: DataConfig, tokenizer, eos_ids, key: str):
    import datasets

    table = datasets.Dataset.from_dict({"id": [r["id"] for r in records],
                                        "messages": [json.dumps(r["messages"]) for r in records]})
    procs = cfg.num_proc if cfg.num_proc is not None else (1 if len(records) < 2000 else min(8, _cpus()))
    return table.map(_encode_row, fn_kwargs=dict(tokenizer=tokenizer, eos_ids=sorted(eos_ids or []) or None,
                                                 max_length=cfg.max_length, system_prompt=cfg.system_prompt),
                     remove_columns=["messages"], num_proc=procs if procs > 1 else None,
                     load_from_cache_file=False, new_fingerprint=key, desc="tokenise")


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _select(encoded, cfg: DataConfig, stats: DataStats):
    """Rows in record order (limit applied) split by id hash, the skipped ones counted in `stats`."""
    keep = {"train": [], "validation": []}
    for i, (skip, truncated, rid) in enumerate(zip(encoded["skip"], encoded["truncated"], encoded["id"])):
        if truncated:
            stats.truncated += 1
        if skip:
            kind, reason = skip.split(":", 1)
            stats.skip(kind, reason, rid)
            continue
        keep[split_of(rid, cfg.val_fraction)].append(i)
        if cfg.limit is not None and len(keep["train"]) + len(keep["validation"]) >= cfg.limit:
            break
    stats.kept = len(keep["train"]) + len(keep["validation"])
    columns = ["id", "input_ids", "loss_mask"]
    return [encoded.select(keep[s]).select_columns(columns) if keep[s] else _empty() for s in ("train", "validation")]


def _empty():
    import datasets

    return datasets.Dataset.from_dict({"id": [], "input_ids": [], "loss_mask": []})


def _load_split(folder: Path):
    import datasets

    return datasets.load_from_disk(str(folder)) if folder.is_dir() else _empty()  # an empty split is not saved


def build_datasets(cfg: DataConfig, tokenizer, eos_ids: set[int] | None = None):
    """Tokenised (train, validation, stats) from `cfg.train`; conversations only (need answers)."""
    from draftsmith.heads.files import tokenizer_fingerprint

    records, stats = load_records(cfg.train)
    if cfg.limit is not None:  # each record yields at most one row: a few more than the limit cover the skips
        records = records[: max(cfg.limit * 2, cfg.limit + 64)]
    key = fingerprint(TOKENIZED_VERSION, records, tokenizer_fingerprint(tokenizer), tokenizer.chat_template,
                      sorted(eos_ids or []), cfg.max_length, cfg.system_prompt, cfg.val_fraction, cfg.limit)
    folder = tokenized_home() / key
    if cfg.cache and (folder / "stats.json").is_file():
        stats = DataStats(**{**json.loads((folder / "stats.json").read_text()), "cache": f"hit {folder}"})
        return _load_split(folder / "train"), _load_split(folder / "validation"), stats
    splits = _select(_tokenise(records, cfg, tokenizer, eos_ids, key), cfg, stats)
    if not cfg.cache:
        return (*splits, stats)
    tmp = scratch(folder)
    for name, split in zip(("train", "validation"), splits):
        if len(split):
            split.save_to_disk(str(tmp / name))
    (tmp / "stats.json").write_text(json.dumps(dict(stats.to_dict(), cache="")))
    publish(tmp, folder)
    stats.cache = f"written {folder}"
    return _load_split(folder / "train"), _load_split(folder / "validation"), stats


def label_counts(rows, vocab_size: int) -> torch.Tensor:
    """How often each token id is a trained label (loss_mask 1) in `rows`: `[V]` int64."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for row in rows:
        ids, mask = torch.as_tensor(row["input_ids"]), torch.as_tensor(row["loss_mask"]).bool()
        counts += torch.bincount(ids[mask], minlength=vocab_size)[:vocab_size]
    return counts
