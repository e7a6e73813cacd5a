"""Self-distillation: the target writes the answers that its drafter will learn to predict.

Between the prompts (`distill/records.py`) and training: reads prompt records and has the target answer
them, turn by turn (turn k+1 sees the target's own answer to turn k), appending one conversation per line
to a JSONL file that `data.build_datasets` reads. Backends (`data.regenerate.backend`):

    hf       the target's own `generate` (batched, left-padded: `Target.generate`); under `accelerate
             launch` the prompts are split across ranks (rank r answers every world-th prompt into its
             own part file; rank 0 merges them: each id once)
    openai   any OpenAI-compatible server (vLLM, SGLang, llama.cpp's server, TGI): the prompt is rendered
             with the target's chat template here and sent to `/v1/completions` (so the server's own
             template does not matter), `concurrency` requests in flight, each with a timeout and
             retries with exponential backoff; the answer's tokens are the target tokenizer's encoding of
             the text the server returned
    vllm     the openai backend against vLLM's OpenAI server, which the pipeline starts from the engine's own
             venv for the stage and stops after it (train/regenerated.py run_regenerate,
             eval/measure/engine_server.py); the meta file names the engine and its version

Reasoning in channels: a target whose tokenizer speaks gpt-oss's harmony format (`<|channel|>` and
`<|message|>` are its tokens) writes an answer as messages, `<|channel|>analysis<|message|>...<|end|>`
then `<|start|>assistant<|channel|>final<|message|>...<|return|>`; decoded without its special tokens
that is one run-on text ("analysis...assistantfinal..."), which its template would render as a final
message the target never wrote. So its answers are read with their tags (the hf backend decodes them,
the servers are asked for `skip_special_tokens: false`) and split: the analysis channel becomes the
turn's `thinking`, the final one its `content` — the fields gpt-oss's template renders back into exactly
the emitted text (llama.cpp b11434 models/templates/openai-gpt-oss-120b.jinja: the last assistant turn
as analysis + final, and it refuses channel tags inside either field). An answer that is not a harmony
analysis/final pair keeps its text without the special tokens, as every other target's does.

Resumable either way: ids already in the output (or a rank's part file) are skipped, a half-written
last line from a killed run is dropped, every conversation is flushed to disk when it is done, so a
rerun after a kill (of the run or of the server) finishes the set with no duplicates. The chat template,
the sampling settings and the backend (with the engine, for vllm) are recorded beside the output
(`<out>.meta.json`). Every backend writes the same answers file.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from draftsmith.distill.data import RegenerateConfig, template_kwargs, with_system
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
    backend: str = "hf"

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


def part_file(out: Path, rank: int) -> Path:
    return out.with_name(f"{out.name}.rank{rank}.part")


def merge_parts(out: Path, world: int) -> int:
    """Append every rank's part file to `out`, each id once, then remove the parts; returns lines added."""
    done, added = finished_ids(out), 0
    with open(out, "a", encoding="utf-8") as fh:
        for rank in range(world):
            part = part_file(out, rank)
            if not part.is_file():
                continue
            finished_ids(part)  # drop a torn tail
            for line in part.read_text(encoding="utf-8").splitlines():
                rid = _record_id(line.encode())
                if rid is not None and rid not in done:
                    fh.write(line + "\n")
                    done.add(rid)
                    added += 1
    for rank in range(world):
        part_file(out, rank).unlink(missing_ok=True)
    return added


def select_prompts(target: Target, cfg: RegenerateConfig, done: set[str], system_prompt: str | None,
                   rank: int = 0, world: int = 1):
    """(todo [(record, user turns, first-turn length)], finished, too long): the first `limit` usable prompts.

    Across `world` ranks, rank r takes the selected prompts at positions r, r + world, ... (finished
    ones keep their place), so the split is the same on every rank and in every rerun.
    """
    records, _ = load_records(cfg.prompts, stats=DataStats())
    todo, seen, selected, skipped_done, too_long = [], set(), 0, 0, 0
    for rec in records:
        if cfg.limit is not None and selected >= cfg.limit:
            break
        turns = [m["content"] for m in rec["messages"] if m["role"] == "user"]
        # an id seen before (sources overlap: spec-bench holds mt-bench's ids) would be written twice
        if not turns or rec["id"] in seen:  # no turns: e.g. a record with only a system turn
            continue
        seen.add(rec["id"])
        first = len(target.chat_ids(with_system([{"role": "user", "content": turns[0]}], system_prompt)))
        if rec["id"] not in done and first > cfg.max_prompt_tokens:
            too_long += 1
            continue
        selected += 1
        if (selected - 1) % world != rank:
            continue
        if rec["id"] in done:
            skipped_done += 1
        else:
            todo.append((rec, turns, first))
    return todo, skipped_done, too_long


HARMONY_TAGS = ("<|channel|>", "<|message|>")
_HARMONY_END = ("<|end|>", "<|return|>")


def speaks_harmony(tokenizer) -> bool:
    """The tokenizer has harmony's channel tags as tokens of their own (gpt-oss)."""
    vocab = tokenizer.get_vocab()
    return all(tag in vocab for tag in HARMONY_TAGS)


def harmony_turn(text: str) -> dict | None:
    """An answer in harmony (what follows the generation prompt `<|start|>assistant`) -> the assistant turn
    `{"content": final, "thinking": analysis}` its template renders back into that text (an answer cut inside
    its analysis: that analysis and an empty final); None when the text is not one analysis message (or none)
    then one final message (other channels, tool calls)."""
    thinking, content = [], None
    messages = text.split("<|start|>assistant")
    for n, message in enumerate(messages):
        head, sep, body = message.partition("<|message|>")
        channel = head.removeprefix("<|channel|>")
        if not sep or not head.startswith("<|channel|>") or content is not None:
            return None
        if channel == "analysis" and body.endswith("<|end|>"):
            thinking.append(body.removesuffix("<|end|>"))
        elif channel == "analysis" and n == len(messages) - 1:  # cut by the length limit while thinking
            thinking.append(body)
            content = ""
        elif channel == "final":  # its <|return|> is the eos token: cut off by the generation, or kept
            content = next((body.removesuffix(end) for end in _HARMONY_END if body.endswith(end)), body)
        else:
            return None
        if any(tag in (thinking[-1] if content is None else content) for tag in (*HARMONY_TAGS, "<|start|>")):
            return None
    if content is None or len(thinking) > 1:
        return None
    return {"content": content, **({"thinking": thinking[0]} if thinking else {})}


def assistant_turn(tokenizer, text: str, harmony: bool) -> dict:
    """The record's assistant turn for an answer (module doc): a harmony answer, read with its tags, split
    into thinking and content (or, when it is no analysis/final pair, its text without them); any other
    answer as it is."""
    if not harmony:
        return {"role": "assistant", "content": text}
    turn = harmony_turn(text)
    if turn is not None:
        return {"role": "assistant", **turn}
    plain = tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"], skip_special_tokens=True)
    return {"role": "assistant", "content": plain}


def _line(rec: dict, conversation: list[dict], finish: str, answer_tokens: int) -> str:
    return json.dumps({"id": rec["id"], "category": rec["category"], "conversation": conversation,
                       "finish": finish, "answer_tokens": answer_tokens}, ensure_ascii=False) + "\n"


def answer_with_hf(target: Target, cfg: RegenerateConfig, todo: list, fh, system_prompt, bar) -> int:
    """Batches of length-sorted prompts through `Target.generate`; returns the new tokens."""
    new_tokens, harmony = 0, speaks_harmony(target.tokenizer)
    for b in range(0, len(todo), cfg.batch_size):
        batch = todo[b: b + cfg.batch_size]
        convs = [with_system([], system_prompt) for _ in batch]
        finish, answer_tokens = ["eos"] * len(batch), [0] * len(batch)
        for turn in range(max(len(turns) for _, turns, _ in batch)):
            active = [i for i, (_, turns, _) in enumerate(batch) if turn < len(turns)]
            for i in active:
                convs[i].append({"role": "user", "content": batch[i][1][turn]})
            answers = target.generate([target.chat_ids(convs[i]) for i in active], cfg.max_new_tokens,
                                      cfg.temperature, cfg.top_p)
            for i, (new, by_eos) in zip(active, answers):
                new_tokens += len(new)
                finish[i], answer_tokens[i] = ("eos" if by_eos else "length"), len(new)
                text = target.tokenizer.decode(new, skip_special_tokens=not harmony)
                convs[i].append(assistant_turn(target.tokenizer, text, harmony))
        for i, (rec, _, _) in enumerate(batch):
            fh.write(_line(rec, convs[i], finish[i], answer_tokens[i]))
        fh.flush()
        bar.update(len(batch))
    return new_tokens


class ServerError(RuntimeError):
    """The server did not answer within the retries; the message names it and the prompt."""


def complete(cfg: RegenerateConfig, prompt: str, keep_special: bool = False) -> tuple[str, str]:
    """One `/v1/completions` request with a timeout and retries (exponential backoff): (text,
    finish_reason). `keep_special` asks for the special tokens in the text (`skip_special_tokens: false`, a
    sampling parameter of vLLM's and SGLang's completions API)."""
    import os

    body = {"prompt": prompt, "max_tokens": cfg.max_new_tokens, "temperature": cfg.temperature,
            "top_p": cfg.top_p, "seed": cfg.seed, **({"model": cfg.model} if cfg.model else {}),
            **({"skip_special_tokens": False} if keep_special else {})}
    headers = {"Content-Type": "application/json"}
    if os.environ.get(cfg.api_key_env):
        headers["Authorization"] = f"Bearer {os.environ[cfg.api_key_env]}"
    request = urllib.request.Request(cfg.url.rstrip("/") + "/completions", data=json.dumps(body).encode(),
                                     headers=headers)
    last = None
    for attempt in range(cfg.retries + 1):
        try:
            with urllib.request.urlopen(request, timeout=cfg.timeout) as response:
                choice = json.loads(response.read())["choices"][0]
            return choice.get("text") or "", choice.get("finish_reason") or "stop"
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError, KeyError, ValueError) as exc:
            last = exc
            if attempt < cfg.retries:
                time.sleep(cfg.backoff * 2**attempt)
    raise ServerError(f"{cfg.url}: no answer after {cfg.retries + 1} tries ({type(last).__name__}: {last}); "
                      "the finished answers are kept: rerun when the server is back")


def answer_with_server(target: Target, cfg: RegenerateConfig, todo: list, fh, system_prompt, bar) -> int:
    """Each conversation in its own thread (at most `concurrency` at once), written as soon as it is done."""
    lock, tokens = threading.Lock(), [0]
    harmony = speaks_harmony(target.tokenizer)

    def one(item) -> None:
        rec, turns, _ = item
        conv, finish, count = with_system([], system_prompt), "eos", 0
        for turn in turns:
            conv.append({"role": "user", "content": turn})
            prompt = target.tokenizer.decode(target.chat_ids(conv), skip_special_tokens=False)
            text, reason = complete(cfg, prompt, keep_special=harmony)
            count = len(target.tokenizer(text, add_special_tokens=False)["input_ids"]) + (reason != "length")
            finish = "length" if reason == "length" else "eos"
            conv.append(assistant_turn(target.tokenizer, text, harmony))
        with lock:
            fh.write(_line(rec, conv, finish, count))
            fh.flush()
            tokens[0] += count
            bar.update(1)

    with ThreadPoolExecutor(max_workers=cfg.concurrency) as pool:
        for future in [pool.submit(one, item) for item in todo]:
            future.result()  # a ServerError stops the run; everything finished is already on disk
    return tokens[0]


def regenerate(target: Target, cfg: RegenerateConfig, out: str | Path, system_prompt: str | None = None,
               progress: bool = True, rank: int = 0, world: int = 1, barrier=None,
               engine: dict | None = None) -> RegenerateReport:
    """Answer every prompt of `cfg.prompts` not yet in `out` (across ranks: this rank's share, see
    select_prompts). `engine`: the server the caller started for backend vllm (name, version, command),
    recorded in the meta file."""
    from tqdm.auto import tqdm

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    server = cfg.backend in ("openai", "vllm")
    if server and rank != 0:  # one client drives the server; the other ranks only wait for it
        if barrier is not None:
            barrier()
            barrier()
        return RegenerateReport(0, 0, 0, 0, 0.0, cfg.concurrency, str(out), cfg.backend)
    split = world > 1 and not server
    written_to = part_file(out, rank) if split else out
    # each rank reads only what it writes itself (and `out`, which nobody appends to until the merge)
    done = finished_ids(out) | (finished_ids(written_to) if split else set())
    todo, skipped_done, too_long = select_prompts(target, cfg, done, system_prompt,
                                                  *((rank, world) if split else (0, 1)))
    todo.sort(key=lambda item: item[2])  # similar lengths share a batch: little padding
    meta = {"backend": cfg.backend, "chat_template": target.tokenizer.chat_template,
            "chat_template_kwargs": template_kwargs(target.tokenizer), "system_prompt": system_prompt,
            "sampling": {k: v for k, v in asdict(cfg).items() if k in ("temperature", "top_p",
                                                                       "max_new_tokens", "seed")},
            **({"server": cfg.url, "model": cfg.model} if server else {"target": target.name}),
            **({"engine": engine} if engine else {})}
    if rank == 0:
        out.with_name(out.name + ".meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    torch.manual_seed(cfg.seed)
    start = time.perf_counter()
    bar = tqdm(total=len(todo), desc="regenerate", unit="prompt", disable=not progress or rank != 0)
    answer = answer_with_hf if cfg.backend == "hf" else answer_with_server
    with open(written_to, "a", encoding="utf-8") as fh:
        new_tokens = answer(target, cfg, todo, fh, system_prompt, bar)
    bar.close()
    if world > 1:  # hf: rank 0 merges the parts once every rank is done; openai: the others wait
        if barrier is not None:
            barrier()
        if rank == 0 and split:
            merge_parts(out, world)
        if barrier is not None:
            barrier()
    return RegenerateReport(written=len(todo), skipped_done=skipped_done, skipped_too_long=too_long,
                            new_tokens=new_tokens, seconds=time.perf_counter() - start,
                            batch_size=cfg.concurrency if server else cfg.batch_size, out=str(out),
                            backend=cfg.backend)
