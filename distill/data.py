"""Conversations -> tokenised training examples with assistant-only loss masks (the `data:` section).

Second stop of the flow: `distill/records.py` reads the sources into one record shape; here every
conversation is rendered with the target's chat template and tokenised, the loss mask set to 1 exactly
on the assistant-written tokens (up to and including the end-of-turn token), and the rows split into
train / validation by a hash of each record's id (the same on every machine and run) -- or, with
`data.validation: [sources]`, every `train` conversation trains and those sources' conversations validate.

Tokenisation runs through `datasets.map` (`data.num_proc` workers) once per fingerprint of (the
records, the tokenizer, its chat template, max length, system prompt, split) and is saved under
`$DRAFTSMITH_HOME/tokenized/<key>/`: every later stage, rank and run with the same inputs loads it
memory-mapped instead of tokenising again (`DataStats.cache` says which happened). Output of
`build_datasets`: two `datasets.Dataset`s with columns `id`, `input_ids` [T] and `loss_mask` [T].

Sizes that follow the data (`auto`): `data.max_length: auto` is the 99th percentile of the tokenised lengths
(`p95`: another one), capped by the target's positions, and the data line says what it chose and how many
conversations it cut (`max_length 1024 (p99 of 30 conversations); 0 of 30 truncated`), as it does for a fixed
length; `data.val_fraction: auto` holds out 2% of the conversations, at least 4 (never more than a quarter)
and at most 1000, chosen by the same id hash.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from draftsmith.distill.cache import fingerprint, publish, scratch, tokenized_home, tokenizer_fingerprint
from draftsmith.distill.records import DataSource, DataStats, load_records

TOKENIZED_VERSION = 2
VAL_AUTO = (0.02, 4, 1000)  # data.val_fraction: auto -> this share of the conversations, at least, at most
LENGTH_RULE = re.compile(r"^(auto|p(\d+(\.\d+)?))$")  # data.max_length: auto (= p99) or pNN


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
    # validation answers from the distribution the drafter is judged on (data.validation:
    # [regenerated-validation]): the target answers these prompts' first turns, taken in eval's order
    # (stratified over categories) from `validation_offset` on -- past the prompts eval reports on (its first
    # eval.limit) -- at most `validation_limit`
    validation_prompts: list[str | DataSource] = field(default_factory=list)
    validation_offset: int = 0
    validation_limit: int | None = None
    # hf: the target's generate; openai: a /v1/completions server; vllm: openai against vLLM's server, started
    # for the stage
    backend: Literal["hf", "openai", "vllm"] = "hf"
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
        if self.validation_offset < 0 or (self.validation_limit is not None and self.validation_limit < 1):
            raise ValueError("data.regenerate.validation_offset must be >= 0 and validation_limit >= 1 (or "
                             "null)")


@dataclass
class DataConfig:
    """`data:` section — what the drafter trains on (sources and formats: distill/records.py)."""

    train: list[str | DataSource] = field(default_factory=lambda: ["smollm2-selfdistill-4k"])
    # tokens per conversation, the rest cut: a number, or `auto` = the 99th percentile of the tokenised
    # lengths (`p95`: that one), capped by the target's positions; the data line reports it and how many were
    # cut
    max_length: int | str = 1024
    # conversations held out for validation (by a hash of each id): a share, or `auto` = 2%, >= 4, <= 1000
    val_fraction: float | Literal["auto"] = 0.02
    # conversations validated on instead of a held-out share of `train` (val_fraction is then unused): answers
    # from the distribution the drafter is judged on, so the validation estimate forecasts the eval
    # (docs/targets-and-data.md); `regenerated-validation` = the target's answers to
    # data.regenerate.validation_prompts (a pipeline stage)
    validation: list[str | DataSource] = field(default_factory=list)
    limit: int | None = None  # use at most N conversations (after skipping bad records)
    system_prompt: str | None = None  # None: the chat template's default
    num_proc: int | None = None  # tokenisation workers; None: 1 for small sets, else up to 8
    cache: bool = True  # reuse (and write) the tokenised cache under $DRAFTSMITH_HOME/tokenized
    regenerate: RegenerateConfig = field(default_factory=RegenerateConfig)

    def __post_init__(self):
        if self.val_fraction != "auto" and not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"data.val_fraction must be in [0, 1) or auto, got {self.val_fraction}")
        if isinstance(self.max_length, str):
            rule = LENGTH_RULE.match(self.max_length)
            if not rule or not 0 < float(rule.group(2) or 99) <= 100:
                raise ValueError("data.max_length must be a number of tokens, auto (the 99th percentile of "
                                 "the tokenised lengths) or pNN (another percentile), got "
                                 f"{self.max_length!r}")
        elif self.max_length < 1:
            raise ValueError(f"data.max_length must be >= 1, got {self.max_length}")


def template_kwargs(tokenizer) -> dict:
    """The template variables the run renders with (model.chat_template_kwargs; distill/target.py
    apply_chat_template), {} for a tokenizer loaded elsewhere."""
    return getattr(tokenizer, "draftsmith_template_kwargs", None) or {}


def render_chat(tokenizer, messages, add_generation_prompt: bool) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt,
                                        **template_kwargs(tokenizer))
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)


def with_system(messages: list[dict], system_prompt: str | None) -> list[dict]:
    if system_prompt is None or (messages and messages[0]["role"] == "system"):
        return messages
    return [{"role": "system", "content": system_prompt}, *messages]


def encode_conversation(tokenizer, messages: list[dict],
                        eos_ids: set[int] | None = None) -> tuple[list[int], list[int]]:
    """Token ids of the whole chat and a mask that is 1 exactly on assistant-written tokens.

    Each assistant span is found by rendering the template up to the turn (with the generation
    prompt) and through it; the span runs to the end-of-turn token (inclusive) — template text
    after it (e.g. ChatML's newline) is not something the model generates, so it is not a target.
    `eos_ids` defaults to the tokenizer's eos token.

    A turn whose render through it is not a prefix of the whole chat, while the render up to it is, is left
    out of the mask: reasoning templates (Qwen3, gpt-oss) drop an earlier turn's thinking once a later user
    turn follows, so the whole chat shows that turn otherwise than the target wrote it (the last turn keeps
    its thinking and is learned as written). A template that rewrites what comes before a turn (a default
    system turn injected only into non-empty chats), or a chat with no turn left to learn, is refused.
    """
    if eos_ids is None and tokenizer.eos_token_id is not None:
        eos_ids = {tokenizer.eos_token_id}
    ids = render_chat(tokenizer, messages, add_generation_prompt=False)
    mask, stable = [0] * len(ids), 0
    for i, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        head = render_chat(tokenizer, messages[:i], add_generation_prompt=True)
        through = render_chat(tokenizer, messages[: i + 1], add_generation_prompt=False)
        # both renders must be prefixes of the whole chat (templates that inject a default system
        # turn only when messages is non-empty, or rewrite earlier turns, are not)
        if head != ids[: len(head)]:
            raise ValueError("chat template is not prefix-stable; cannot locate assistant tokens")
        if through != ids[: len(through)]:
            continue  # this turn is shown otherwise once later turns follow (its thinking dropped)
        stable += 1
        start, end = len(head), len(through)
        for j in range(start, end):
            mask[j] = 1
            if eos_ids and ids[j] in eos_ids:
                break
    if not stable and any(m["role"] == "assistant" for m in messages):
        raise ValueError("chat template is not prefix-stable: no assistant turn renders as a prefix of the "
                         "whole chat")
    return ids, mask


def id_hash(record_id: str) -> float:
    """A record's place in [0, 1], from its id: the same on every machine and run."""
    return int(hashlib.sha256(record_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF


def split_of(record_id: str, val_fraction: float) -> str:
    """Deterministic split by id hash: the same record lands on the same side on every machine."""
    return "validation" if id_hash(record_id) < val_fraction else "train"


def auto_val_count(conversations: int) -> int:
    """`data.val_fraction: auto`: how many of `conversations` validate (2%, at least 4, at most 1000, and
    never more than a quarter, so that a small set still trains)."""
    share, least, most = VAL_AUTO
    return min(max(round(share * conversations), least), most, conversations // 4)


def auto_max_length(rule: str, lengths: list[int], cap: int | None) -> tuple[int, str]:
    """`data.max_length: auto | pNN` -> (tokens, how): the nearest-rank percentile of the tokenised `lengths`,
    rounded up to a multiple of 8, at most `cap` (the target's positions)."""
    q = 99.0 if rule == "auto" else float(rule[1:])
    ordered = sorted(lengths)
    if not ordered:
        return cap or 1, "no conversations to measure"
    pick = ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]
    how = f"p{q:g} of {len(ordered)} conversations"
    tokens = -(-pick // 8) * 8
    if cap is not None and tokens >= cap:
        return cap, how + (f", capped by the target's {cap} positions" if pick > cap else "")
    return tokens, how


def _encode_row(record: dict, tokenizer, eos_ids, max_length: int | None, system_prompt: str | None) -> dict:
    """One record -> its row, or its reason for being skipped (`skip`) — what `datasets.map` runs. `length` is
    the whole conversation's (0: not tokenised), before the cut to `max_length` (None: no cut)."""
    from jinja2 import TemplateError  # strict templates raise it (e.g. "roles must alternate")

    out = {"id": record["id"], "input_ids": [], "loss_mask": [], "skip": "", "truncated": False, "length": 0}
    messages = json.loads(record["messages"])
    if not any(m["role"] == "assistant" for m in messages):
        return dict(out, skip="empty:no assistant turn (run regenerate first)")
    try:
        ids, mask = encode_conversation(tokenizer, with_system(messages, system_prompt), eos_ids)
    except (ValueError, TemplateError):
        return dict(out, skip="malformed:template error")
    return _cut(dict(out, input_ids=ids, loss_mask=mask, length=len(ids)), max_length)


def _cut(row: dict, max_length: int | None) -> dict:
    """A row cut to `max_length` tokens (flagged `truncated`); skipped when no assistant token is left."""
    if max_length is None or row["skip"] or len(row["input_ids"]) <= max_length:
        return row
    row = dict(row, input_ids=row["input_ids"][:max_length], loss_mask=row["loss_mask"][:max_length],
               truncated=True)
    return row if sum(row["loss_mask"]) else dict(row, skip="empty:no assistant tokens within max_length")


def _tokenise(records: list[dict], cfg: DataConfig, tokenizer, eos_ids, key: str, max_length: int | None):
    import datasets

    table = datasets.Dataset.from_dict({"id": [r["id"] for r in records],
                                        "messages": [json.dumps(r["messages"]) for r in records]})
    procs = cfg.num_proc if cfg.num_proc is not None else (1 if len(records) < 2000 else min(8, _cpus()))
    return table.map(_encode_row, fn_kwargs=dict(tokenizer=tokenizer, eos_ids=sorted(eos_ids or []) or None,
                                                 max_length=max_length, system_prompt=cfg.system_prompt),
                     remove_columns=["messages"], num_proc=procs if procs > 1 else None,
                     load_from_cache_file=False, new_fingerprint=key, desc="tokenise")


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _sized(encoded, cfg: DataConfig, stats: DataStats, cap: int | None, key: str):
    """The rows cut to `data.max_length`, which `auto` / `pNN` choose here from the lengths of the
    conversations a run would use (in record order, up to the limit); `stats` records the length and how it
    was chosen."""
    if not isinstance(cfg.max_length, str):
        stats.max_length, stats.max_length_from = cfg.max_length, "data.max_length"
        return encoded
    lengths = [n for n, skip in zip(encoded["length"], encoded["skip"]) if not skip][: cfg.limit]
    stats.max_length, stats.max_length_from = auto_max_length(cfg.max_length, lengths, cap)
    if all(n <= stats.max_length for n in encoded["length"]):
        return encoded
    return encoded.map(_cut, fn_kwargs=dict(max_length=stats.max_length), load_from_cache_file=False,
                       new_fingerprint=f"{key}-cut", desc="cut")


def _select(encoded, cfg: DataConfig, stats: DataStats, n_train: int, overlap: frozenset = frozenset()):
    """Rows in record order (limit applied) split by id hash -- or, with `data.validation`, the first
    `n_train` rows train (but the `overlap` ones, whose prompt a validation conversation asks) and the rest
    (its sources' rows, no limit) validate; the skipped ones counted in `stats`."""
    kept, given = [], []
    for i, (skip, truncated, rid, length) in enumerate(zip(encoded["skip"], encoded["truncated"],
                                                           encoded["id"], encoded["length"])):
        if i < n_train and (i in overlap or (cfg.limit is not None and len(kept) >= cfg.limit)):
            continue
        stats.truncated += bool(truncated)
        stats.measured += length > 0
        if skip:
            kind, reason = skip.split(":", 1)
            stats.skip(kind, reason, rid)
            continue
        (kept if i < n_train else given).append(i)
    ids = encoded["id"]
    if cfg.validation:  # every training conversation trains, but those asking a validation prompt
        held = set(given)
        stats.validation = f"{len(given)} conversations from data.validation"
        if overlap:
            stats.validation += (f"; {len(overlap)} training conversations asking one of their prompts left "
                                 "out")
        kept += given
    # the count with the smallest id hashes: as stable as the fraction's split
    elif cfg.val_fraction == "auto":
        held = set(sorted(kept, key=lambda i: id_hash(ids[i]))[: auto_val_count(len(kept))])
    else:
        held = {i for i in kept if split_of(ids[i], cfg.val_fraction) == "validation"}
    keep = {"train": [i for i in kept if i not in held], "validation": [i for i in kept if i in held]}
    stats.kept = len(kept)
    columns = ["id", "input_ids", "loss_mask"]
    return [encoded.select(keep[s]).select_columns(columns) if keep[s] else _empty() for s in ("train",
                                                                                               "validation")]


def first_prompt(record: dict) -> str:
    """A conversation's first user turn, stripped (how data.validation finds training conversations on its
    prompts)."""
    return next((m["content"].strip() for m in record["messages"] if m["role"] == "user"), "")


def _empty():
    import datasets

    return datasets.Dataset.from_dict({"id": [], "input_ids": [], "loss_mask": []})


def _load_split(folder: Path):
    import datasets

    # an empty split is not saved
    return datasets.load_from_disk(str(folder)) if folder.is_dir() else _empty()


def target_datasets(cfg: DataConfig, target):
    """`build_datasets` for a loaded target (distill/target.py): its tokenizer, end-of-turn tokens and
    positions."""
    config = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
    return build_datasets(cfg, target.tokenizer, set(target.eos_token_ids),
                          getattr(config, "max_position_embeddings", None))


def build_datasets(cfg: DataConfig, tokenizer, eos_ids: set[int] | None = None,
                   max_positions: int | None = None):
    """Tokenised (train, validation, stats) from `cfg.train` (and `cfg.validation`, when it names sources:
    then the validation split); conversations only (need answers). `max_positions` (the target's) caps
    `data.max_length: auto` and is the only cut of validation sources' conversations."""

    records, stats = load_records(cfg.train)
    if cfg.limit is not None:  # each record yields at most one row: a few more than the limit cover the skips
        records = records[: max(cfg.limit * 2, cfg.limit + 64)]
    n_train, overlap, held = len(records), frozenset(), []
    if cfg.validation:
        held = load_records(cfg.validation, stats=stats)[0]
        asked = {first_prompt(r) for r in held} - {""}
        overlap = frozenset(i for i, r in enumerate(records) if first_prompt(r) in asked)
    cap = max_positions if isinstance(cfg.max_length, str) else None
    split_rule = ("validation", held, max_positions) if cfg.validation else cfg.val_fraction
    variables = template_kwargs(tokenizer)  # in the key only when set: the caches written before stay valid
    key = fingerprint(TOKENIZED_VERSION, records, tokenizer_fingerprint(tokenizer), tokenizer.chat_template,
                      *([sorted(variables.items())] if variables else []), sorted(eos_ids or []),
                      cfg.max_length, cap, cfg.system_prompt, split_rule, cfg.limit)
    folder = tokenized_home() / key
    if cfg.cache and (folder / "stats.json").is_file():
        stats = DataStats(**{**json.loads((folder / "stats.json").read_text()), "cache": f"hit {folder}"})
        return _load_split(folder / "train"), _load_split(folder / "validation"), stats
    encoded = _sized(_tokenise(records, cfg, tokenizer, eos_ids, key, cap if isinstance(cfg.max_length, str)
                               else cfg.max_length), cfg, stats, cap, key)
    if held:  # validation conversations whole, as eval sees them (only the target's positions cut them)
        import datasets

        encoded = datasets.concatenate_datasets(
            [encoded, _tokenise(held, cfg, tokenizer, eos_ids, f"{key}-validation", max_positions)])
    splits = _select(encoded, cfg, stats, n_train, overlap)
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
