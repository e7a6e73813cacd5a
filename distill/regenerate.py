"""Self-distillation: the target writes the answers that its drafter will learn to predict.

Between the prompts (`distill/data.py`) and training: reads prompt records, generates with the
target's own `generate` (batched, left-padded, greedy or sampled), and appends one conversation
per line to a JSONL file that `data.build_datasets` reads. Resumable: ids already in the output are
skipped, a half-written last line from a killed run is dropped, every batch is flushed to disk, so
a rerun after a kill finishes the set with no duplicates.

Multi-turn prompts are answered turn by turn (turn k+1 sees the target's own answer to turn k).
Batches are formed from length-sorted prompts so left padding stays small: ids [B, T] -> [B, T+new]
(`Target.generate`: left-padded HF generate, each answer cut after its end-of-sequence token).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from draftsmith.distill.data import RegenerateConfig, with_system
from draftsmith.distill.records import DataStats, load_records
from draftsmith.distill.target import Target


@dataclass
class RegenerateReport:
    written: int
    skipped_done: int
    skipped_too_long: int
    new_tokens: int
    seconds: float
    batch_size: int
    out: str

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0


def _record_id(line: bytes) -> str | None:
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return str(record["id"]) if isinstance(record, dict) and "id" in record else None


def finished_ids(out: Path) -> set[str]:
    """Ids already written; a torn last line (killed mid-write: no newline) is cut off the file.

    Only the unterminated tail is cut, so the next append starts on a fresh line; a complete line
    that does not parse is left alone (its id is not done, it will be regenerated).
    """
    if not out.is_file():
        return set()
    done, complete_bytes = set(), 0
    with open(out, "rb") as fh:
        for line in fh:
            if not line.endswith(b"\n"):
                break  # the torn tail
            complete_bytes += len(line)
            rid = _record_id(line)
            if rid is not None:
                done.add(rid)
    if complete_bytes < out.stat().st_size:
        with open(out, "r+b") as fh:
            fh.truncate(complete_bytes)
    return done


def regenerate(target: Target, cfg: RegenerateConfig, out: str | Path, system_prompt: str | None = None,
               progress: bool = True) -> RegenerateReport:
    """Answer every prompt of `cfg.prompts` not yet in `out`; append results as they finish."""
    from tqdm.auto import tqdm

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    records, _ = load_records(cfg.prompts, stats=DataStats())
    done = finished_ids(out)
    todo, seen, selected, skipped_done, too_long = [], set(), 0, 0, 0
    for rec in records:  # the first `limit` usable prompts, finished or not
        if cfg.limit is not None and selected >= cfg.limit:
            break
        turns = [m["content"] for m in rec["messages"] if m["role"] == "user"]
        # an id seen before (sources overlap: spec-bench holds mt-bench's ids) would be written twice
        if not turns or rec["id"] in seen:  # no turns: e.g. a record with only a system turn
            continue
        seen.add(rec["id"])
        if rec["id"] in done:
            selected, skipped_done = selected + 1, skipped_done + 1
            continue
        first = len(target.chat_ids(with_system([{"role": "user", "content": turns[0]}], system_prompt)))
        if first > cfg.max_prompt_tokens:
            too_long += 1
            continue
        todo.append((rec, turns, first))
        selected += 1
    todo.sort(key=lambda item: item[2])  # similar lengths share a batch: little padding
    torch.manual_seed(cfg.seed)
    new_tokens, start = 0, time.perf_counter()
    bar = tqdm(total=len(todo), desc="regenerate", unit="prompt", disable=not progress)
    with open(out, "a", encoding="utf-8") as fh:
        for b in range(0, len(todo), cfg.batch_size):
            batch = todo[b: b + cfg.batch_size]
            convs = [with_system([], system_prompt) for _ in batch]
            finish, answer_tokens = ["eos"] * len(batch), [0] * len(batch)
            for turn in range(max(len(turns) for _, turns, _ in batch)):
                active = [i for i, (_, turns, _) in enumerate(batch) if turn < len(turns)]
                for i in active:
                    convs[i].append({"role": "user", "content": batch[i][1][turn]})
                prompts = [target.chat_ids(convs[i]) for i in active]
                answers = target.generate(prompts, cfg.max_new_tokens, cfg.temperature, cfg.top_p)
                for i, (new, by_eos) in zip(active, answers):
                    new_tokens += len(new)
                    finish[i], answer_tokens[i] = ("eos" if by_eos else "length"), len(new)
                    text = target.tokenizer.decode(new, skip_special_tokens=True)
                    convs[i].append({"role": "assistant", "content": text})
            for i, (rec, _, _) in enumerate(batch):
                fh.write(json.dumps({"id": rec["id"], "category": rec["category"], "conversation": convs[i],
                                     "finish": finish[i], "answer_tokens": answer_tokens[i]}, ensure_ascii=False) + "\n")
            fh.flush()
            bar.update(len(batch))
            bar.set_postfix(tok_s=f"{new_tokens / (time.perf_counter() - start):.0f}")
    bar.close()
    return RegenerateReport(written=len(todo), skipped_done=skipped_done, skipped_too_long=too_long,
                            new_tokens=new_tokens, seconds=time.perf_counter() - start,
                            batch_size=cfg.batch_size, out=str(out))

