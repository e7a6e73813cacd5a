"""Self-distillation (distill/regenerate.py) on the tiny target.

A killed run (exception after a couple of batches, then a torn half line) resumes to a file with
every id exactly once that `data.load_records` reads as conversations; `limit` and duplicate ids
behave; batched left-padded greedy answers equal unbatched ones, so padding leaks nothing.
"""

import json
from collections import Counter

import pytest

from draftsmith.distill.data import RegenerateConfig, load_records
from draftsmith.distill.regenerate import finished_ids, regenerate

N = 12


def _prompts(tmp_path, n: int = N) -> str:
    rows = [{"id": f"p{i}", "category": "c", "prompt": "tell me " + "more " * (i % 5) + f"about {i}"}
            for i in range(n)]
    if n > 3:
        rows[3] = {"id": "p3", "turns": ["first turn", "and a follow-up"]}  # answered turn by turn
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _cfg(prompts: str, **kw) -> RegenerateConfig:
    return RegenerateConfig(prompts=[prompts], batch_size=4, max_new_tokens=5, **kw)


def _ids(path) -> list[str]:
    return [json.loads(line)["id"] for line in open(path, encoding="utf-8")]


class Killed(RuntimeError):
    pass


def test_killed_run_resumes_without_duplicates(tiny_target, tmp_path, monkeypatch):
    prompts, out = _prompts(tmp_path), tmp_path / "run" / "regenerated.jsonl"
    real, calls = tiny_target.generate, []

    def dies_on_third_call(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise Killed("simulated kill")
        return real(*args, **kwargs)

    monkeypatch.setattr(tiny_target, "generate", dies_on_third_call)
    with pytest.raises(Killed):
        regenerate(tiny_target, _cfg(prompts), out, progress=False)
    monkeypatch.undo()
    written = len(_ids(out))
    assert written in (4, 8)  # whole batches only (the two-turn prompt costs a batch two calls)
    with open(out, "a", encoding="utf-8") as fh:  # a kill in the middle of a write
        fh.write('{"id": "p11", "category": "c", "conversation": [{"role": "us')

    report = regenerate(tiny_target, _cfg(prompts), out, progress=False)
    assert report.skipped_done == written and report.written == N - written
    assert report.new_tokens > 0 and report.skipped_too_long == 0

    ids = _ids(out)
    assert Counter(ids) == Counter(f"p{i}" for i in range(N))  # every id exactly once
    records, stats = load_records(str(out))
    assert stats.malformed == 0 and stats.empty == 0 and len(records) == N
    by_id = {r["id"]: r for r in records}
    assert [m["role"] for m in by_id["p3"]["messages"]] == ["user", "assistant", "user", "assistant"]
    assert all(r["messages"][-1]["role"] == "assistant" for r in records)
    line = json.loads(open(out).readline())
    assert line["finish"] in ("eos", "length") and 0 < line["answer_tokens"] <= 5

    again = regenerate(tiny_target, _cfg(prompts), out, progress=False)
    assert (again.written, again.skipped_done) == (0, N)


def test_limit_then_rest(tiny_target, tmp_path):
    prompts, out = _prompts(tmp_path), tmp_path / "out.jsonl"
    first = regenerate(tiny_target, _cfg(prompts, limit=5), out, progress=False)
    assert first.written == 5 and sorted(_ids(out)) == sorted(f"p{i}" for i in range(5))
    # a larger limit counts finished prompts towards it: only the next 3 are new
    second = regenerate(tiny_target, _cfg(prompts, limit=8), out, progress=False)
    assert (second.written, second.skipped_done) == (3, 5)
    rest = regenerate(tiny_target, _cfg(prompts), out, progress=False)
    assert (rest.written, rest.skipped_done) == (N - 8, 8)
    assert Counter(_ids(out)) == Counter(f"p{i}" for i in range(N))


def test_duplicate_ids_across_sources_are_answered_once(tiny_target, tmp_path):
    prompts, out = _prompts(tmp_path, n=3), tmp_path / "out.jsonl"
    cfg = RegenerateConfig(prompts=[prompts, prompts], batch_size=4, max_new_tokens=2)
    assert regenerate(tiny_target, cfg, out, progress=False).written == 3
    assert sorted(_ids(out)) == ["p0", "p1", "p2"]


def test_too_long_prompts_are_skipped_and_counted(tiny_target, tmp_path):
    prompts, out = _prompts(tmp_path, n=4), tmp_path / "out.jsonl"
    shortest = min(len(tiny_target.chat_ids(r["messages"][:1])) for r in load_records(prompts)[0])
    report = regenerate(tiny_target, _cfg(prompts, max_prompt_tokens=shortest), out, progress=False)
    assert report.written >= 1 and report.written + report.skipped_too_long == 4


def test_system_prompt_is_written(tiny_target, tmp_path):
    prompts, out = _prompts(tmp_path, n=2), tmp_path / "out.jsonl"
    regenerate(tiny_target, _cfg(prompts), out, system_prompt="Be brief.", progress=False)
    records, _ = load_records(str(out))
    assert all(r["messages"][0] == {"role": "system", "content": "Be brief."} for r in records)


def test_finished_ids_cuts_only_a_torn_tail(tmp_path):
    out = tmp_path / "r.jsonl"
    assert finished_ids(out) == set()
    good = [json.dumps({"id": i, "conversation": []}) + "\n" for i in ("a", "b")]
    out.write_text(good[0] + "not json\n" + "[1]\n" + good[1] + '{"id": "c"}')  # last line has no newline
    assert finished_ids(out) == {"a", "b"}  # a bad complete line does not hide the lines after it
    assert out.read_text() == good[0] + "not json\n" + "[1]\n" + good[1]  # the unterminated tail is gone
    assert finished_ids(out) == {"a", "b"}  # idempotent


def test_batched_left_padded_greedy_equals_unbatched(tiny_target, monkeypatch):
    texts = ["hi", "a much longer prompt that needs plenty of left padding in a batch",
             "why is the sky blue?", "x" * 30, "okay"]
    prompts = [tiny_target.chat_ids(t) for t in texts]
    assert len({len(p) for p in prompts}) == len(prompts)  # all different lengths: real padding
    alone = [tiny_target.generate([p], 10)[0] for p in prompts]
    # make one answer stop early (a token it emits mid-way becomes an extra eos), so the batch also
    # holds finished rows that keep getting padded while the others continue
    stopper = alone[0][0][3]
    monkeypatch.setattr(tiny_target.model.generation_config, "eos_token_id", [2, stopper])
    alone = [tiny_target.generate([p], 10)[0] for p in prompts]
    together = tiny_target.generate(prompts, 10)
    assert together == alone
    assert any(by_eos for _, by_eos in alone) and all(
        (new[-1] in (2, stopper)) == by_eos and len(new) <= 10 for new, by_eos in alone)


# --- across ranks, and through an OpenAI-compatible server -------------------------------------------


def _by_id(path) -> dict:
    return {r["id"]: r for r in map(json.loads, open(path, encoding="utf-8"))}


def test_two_ranks_split_the_prompts_and_merge_to_the_one_process_file(tiny_target, tmp_path):
    prompts = _prompts(tmp_path)
    alone = tmp_path / "alone.jsonl"
    regenerate(tiny_target, _cfg(prompts), alone, progress=False)
    split = tmp_path / "split.jsonl"
    # the ranks run one after the other here (no barrier): rank 0 runs last and merges both parts
    r1 = regenerate(tiny_target, _cfg(prompts), split, progress=False, rank=1, world=2)
    r0 = regenerate(tiny_target, _cfg(prompts), split, progress=False, rank=0, world=2)
    assert r0.written + r1.written == N and abs(r0.written - r1.written) <= 1
    assert Counter(_ids(split)) == Counter(f"p{i}" for i in range(N))  # each id once
    assert _by_id(split) == _by_id(alone)  # the same answers as one process wrote
    assert not list(tmp_path.glob("split.jsonl.rank*.part"))
    again = regenerate(tiny_target, _cfg(prompts), split, progress=False, rank=0, world=2)
    assert (again.written, again.skipped_done) == (0, N // 2)  # its own share, all finished


class FakeServer:
    """A `/v1/completions` endpoint: answers `echo: <last words>`; can fail the first requests or die."""

    def __init__(self, fail_first: int = 0, die_after: int | None = None, delay: float = 0.0, answer=None):
        import http.server
        import threading

        self.fail_first, self.die_after, self.delay = fail_first, die_after, delay
        self.answer = answer or (lambda body: "echo " + " ".join(body["prompt"].split()[-3:]))
        self.bodies = []
        self.requests, self.in_flight, self.max_in_flight = 0, 0, 0
        self.lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                import time

                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.requests += 1
                    n = server.requests
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    if server.die_after is not None and n > server.die_after:
                        self.close_connection = True
                        self.connection.close()  # as if the server process were gone
                        return
                    if n <= server.fail_first:
                        self.send_response(503)
                        self.end_headers()
                        return
                    time.sleep(server.delay)
                    server.bodies.append(body)
                    answer = {"choices": [{"text": server.answer(body), "finish_reason": "stop"}]}
                    data = json.dumps(answer).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                finally:
                    with server.lock:
                        server.in_flight -= 1

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def _server_cfg(prompts, url, **kw) -> RegenerateConfig:
    return RegenerateConfig(prompts=[prompts], backend="openai", url=url, max_new_tokens=5, retries=2,
                            backoff=0.01, timeout=10.0, **kw)


def test_server_backend_retries_then_writes_every_conversation(tiny_target, tmp_path):
    prompts, out = _prompts(tmp_path), tmp_path / "out.jsonl"
    with FakeServer(fail_first=2, delay=0.05) as server:
        report = regenerate(tiny_target, _server_cfg(prompts, server.url, concurrency=4), out, progress=False)
    assert report.backend == "openai" and report.written == N
    assert server.requests == N + 1 + 2  # one per turn (p3 has two), plus the two refused and retried
    assert server.max_in_flight >= 2  # requests were in flight together
    records = _by_id(out)
    assert set(records) == {f"p{i}" for i in range(N)}
    assert [m["role"] for m in records["p3"]["conversation"]] == ["user", "assistant", "user", "assistant"]
    assert records["p0"]["conversation"][-1]["content"].startswith("echo ")
    meta = json.loads((tmp_path / "out.jsonl.meta.json").read_text())
    assert meta["backend"] == "openai" and meta["server"] == server.url and meta["chat_template"]


def test_server_killed_mid_run_then_rerun_has_no_duplicates(tiny_target, tmp_path):
    from draftsmith.distill.regenerate import ServerError

    prompts, out = _prompts(tmp_path), tmp_path / "out.jsonl"
    with FakeServer(die_after=5) as server:
        with pytest.raises(ServerError, match="no answer after 3 tries.*rerun when the server is back"):
            regenerate(tiny_target, _server_cfg(prompts, server.url, concurrency=2), out, progress=False)
    kept = _ids(out)
    assert 0 < len(kept) < N and len(set(kept)) == len(kept)
    with FakeServer() as server:
        report = regenerate(tiny_target, _server_cfg(prompts, server.url, concurrency=2), out, progress=False)
    assert report.skipped_done == len(kept) and report.written == N - len(kept)
    assert Counter(_ids(out)) == Counter(f"p{i}" for i in range(N))


HARMONY_ANSWER = ("<|channel|>analysis<|message|>the user asks; answer briefly<|end|>"
                  "<|start|>assistant<|channel|>final<|message|>short answer")


def _harmony_server_answer(body) -> str:
    """What vLLM returns for a gpt-oss answer: its tags only with `skip_special_tokens: false`."""
    if body.get("skip_special_tokens") is False:
        return HARMONY_ANSWER
    return HARMONY_ANSWER.replace("<|channel|>", "").replace("<|message|>", "").replace(
        "<|end|>", "").replace("<|start|>", "")


def _learned(tokenizer, conversation) -> list[int]:
    """The tokens training learns of a conversation (data.encode_conversation's mask)."""
    from draftsmith.distill.data import encode_conversation

    ids, mask = encode_conversation(tokenizer, conversation)
    return [t for t, m in zip(ids, mask) if m]


def test_harmony_answers_split_into_thinking_and_content(tiny_target, tmp_path):
    """A gpt-oss-style target (harmony tags; tests/helpers.py HARMONY_TEMPLATE): the server is asked for
    the special tokens, the answer is stored as `thinking` (analysis) + `content` (final), and training then
    learns exactly the tokens the target emitted (its answer and its `<|return|>`). Twin: a server that strips
    the tags whatever it is asked (vLLM's default) gives a run-on content, learned as tokens the target never
    wrote."""
    from helpers import build_harmony_tokenizer

    from draftsmith.distill.target import Target

    tokenizer = build_harmony_tokenizer()
    target = Target(tiny_target.model, tokenizer, name="harmony")
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"id": "h0", "category": "c", "turns": ["first", "second"]}) + "\n")
    emitted = tokenizer(HARMONY_ANSWER + "<|return|>", add_special_tokens=False)["input_ids"]

    with FakeServer(answer=_harmony_server_answer) as server:
        regenerate(target, _server_cfg(str(path), server.url), tmp_path / "out.jsonl", progress=False)
    assert all(body["skip_special_tokens"] is False for body in server.bodies)
    conv = _by_id(tmp_path / "out.jsonl")["h0"]["conversation"]
    assert conv[-1] == {"role": "assistant", "content": "short answer",
                        "thinking": "the user asks; answer briefly"}
    assert _learned(tokenizer, conv) == emitted  # the last turn as written; the first's thinking is dropped

    # the hf backend: what generate returns (ids through the eos) decoded with its tags, split the same way
    target.generate = lambda prompts, *args: [(emitted, True) for _ in prompts]
    regenerate(target, RegenerateConfig(prompts=[str(path)], max_new_tokens=64), tmp_path / "hf.jsonl",
               progress=False)
    assert _by_id(tmp_path / "hf.jsonl")["h0"]["conversation"] == conv

    with FakeServer(answer=lambda body: _harmony_server_answer({})) as server:  # the tags always stripped
        regenerate(target, _server_cfg(str(path), server.url), tmp_path / "twin.jsonl", progress=False)
    twin = _by_id(tmp_path / "twin.jsonl")["h0"]["conversation"]
    assert "thinking" not in twin[-1] and twin[-1]["content"].startswith("analysisthe user asks")
    assert _learned(tokenizer, twin) != emitted


@pytest.mark.parametrize("text, turn", [
    (HARMONY_ANSWER + "<|return|>", {"content": "short answer", "thinking": "the user asks; answer briefly"}),
    ("<|channel|>final<|message|>no analysis<|end|>", {"content": "no analysis"}),
    ("<|channel|>analysis<|message|>cut in its analy", {"content": "", "thinking": "cut in its analy"}),
    ("<|channel|>commentary<|message|>x<|end|><|start|>assistant<|channel|>final<|message|>y", None),
    ("plain text", None),
])
def test_harmony_turn_reads_analysis_then_final(text, turn):
    from draftsmith.distill.regenerate import harmony_turn

    assert harmony_turn(text) == turn


def test_server_backend_is_a_config_choice(tmp_path):
    from draftsmith.train.config import ConfigError, load_config

    cfg = load_config(None,
                      [f"data.regenerate.prompts=[{tmp_path}/p.jsonl]", "data.regenerate.backend=openai",
                             "data.regenerate.url=http://h:1/v1", "data.regenerate.concurrency=3"])
    assert (cfg.data.regenerate.backend, cfg.data.regenerate.concurrency) == ("openai", 3)
    with pytest.raises((ConfigError, ValueError), match="backend"):
        load_config(None, ["data.regenerate.backend=grpc"])


def test_a_server_that_is_down_is_a_clear_cli_error(tiny_llama_dir, tmp_path, capsys):
    """`draftsmith regenerate` with backend openai and nothing listening: exit 2 and one line naming the
    server and what to do, not a traceback."""
    import socket

    from draftsmith.train.cli import main

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code = main(["regenerate", "--out", str(tmp_path / "run"), f"model.target={tiny_llama_dir}",
                 "model.dtype=float32", f"data.regenerate.prompts=[{_prompts(tmp_path)}]",
                 "data.regenerate.backend=openai", f"data.regenerate.url=http://127.0.0.1:{port}/v1",
                 "data.regenerate.retries=0", "log.progress=false"])
    err = capsys.readouterr().err
    assert code == 2 and f"127.0.0.1:{port}" in err and "rerun when the server is back" in err
    assert "Traceback" not in err


def test_regenerated_names_the_runs_answers_for_training_and_the_datastore(tmp_path):
    """`regenerated` in `data.train` and in `drafter.lookup_datastore` both stand for this run's answers file
    (the target's own answers: what the drafter trains on, and what prompt lookup drafts from); other sources
    stay."""
    from draftsmith.train.config import load_config
    from draftsmith.train.regenerated import with_run_sources

    cfg = load_config(None,
                      [f"data.regenerate.prompts=[{tmp_path}/p.jsonl]", "data.train=[regenerated,mine.jsonl]",
                             "drafter.lookup_datastore=[regenerated]"])
    run = with_run_sources(cfg, tmp_path / "run")
    answers = str(tmp_path / "run" / "regenerated.jsonl")
    assert run.data.train == [answers, "mine.jsonl"] and run.drafter.lookup_datastore == [answers]
    elsewhere = load_config(None, ["data.regenerate.out=/data/answers.jsonl",
                                   "drafter.lookup_datastore=[regenerated]"])
    assert with_run_sources(elsewhere, tmp_path).drafter.lookup_datastore == ["/data/answers.jsonl"]
    assert cfg.drafter.lookup_datastore == ["regenerated"]  # a copy: the config itself is unchanged


def test_regenerated_validation_answers_held_out_eval_prompts(tiny_llama_dir, tmp_path):
    """data.regenerate.validation_prompts: the target answers the first turn of eval's prompts from
    `validation_offset` on (eval's stratified order, so disjoint from the first `validation_offset` eval
    reports on), into regenerated-validation.jsonl, which `regenerated-validation` in data.validation names; a
    rerun adds nothing."""
    from draftsmith.eval.measure.evaluate import EvalConfig, select_prompts
    from draftsmith.train.cli import main
    from draftsmith.train.config import load_config
    from draftsmith.train.regenerated import with_run_sources

    run = tmp_path / "run"
    args = ["regenerate", "--out", str(run), f"model.target={tiny_llama_dir}", "model.dtype=float32",
            "data.regenerate.validation_prompts=[spec-bench]", "data.regenerate.validation_offset=240",
            "data.regenerate.validation_limit=7", "eval.max_new_tokens=4", "log.progress=false"]
    assert main(args) == 0
    written = [json.loads(line) for line in (run / "regenerated-validation.jsonl").read_text().splitlines()]
    expected = select_prompts(EvalConfig(prompts="spec-bench", limit=7, offset=240))
    reported = {p["id"] for p in select_prompts(EvalConfig(prompts="spec-bench", limit=240))}
    # written batch by batch, each once
    written.sort(key=lambda w: [p["id"] for p in expected].index(w["id"]))
    assert ([w["id"] for w in written] == [p["id"] for p in expected]
            and not reported & {w["id"] for w in written})
    assert len({p["category"] for p in expected}) == 6  # every category of the benchmark, the long ones too
    for w, p in zip(written, expected):
        roles = [m["role"] for m in w["conversation"] if m["role"] != "system"]
        assert roles == ["user", "assistant"] and w["conversation"][-2]["content"] == p["prompt"]
    assert not (run / "regenerated.jsonl").exists()  # no training prompts were named
    before = (run / "regenerated-validation.jsonl").read_text()
    assert main(args) == 0 and (run / "regenerated-validation.jsonl").read_text() == before
    cfg = load_config(None, ["data.validation=[regenerated-validation]",
                             "data.regenerate.validation_prompts=[spec-bench]",
                             "data.regenerate.validation_offset=240"])
    assert with_run_sources(cfg, run).data.validation == [str(run / "regenerated-validation.jsonl")]
    # another offset: the answers to prompts no longer chosen are dropped, the others kept (not answered
    # again)
    assert main([*args[:-3], "data.regenerate.validation_limit=4", *args[-2:]]) == 0
    kept = [json.loads(line)["id"]
            for line in (run / "regenerated-validation.jsonl").read_text().splitlines()]
    assert sorted(kept) == sorted(p["id"] for p in expected[:4])


def test_regenerated_validation_without_its_prompts_is_one_clear_error(tmp_path):
    from draftsmith.train.config import load_config
    from draftsmith.train.regenerated import with_run_sources

    with pytest.raises(ValueError, match="data.regenerate.validation_prompts is empty"):
        with_run_sources(load_config(None, ["data.validation=[regenerated-validation]"]), tmp_path)
    # validation answers to the prompts eval reports on would choose on the test set: refused, naming the
    # offset
    overlapping = load_config(None,
                              ["data.regenerate.validation_prompts=[spec-bench]", "eval.prompts=spec-bench",
                                     "eval.limit=80", "data.regenerate.validation_offset=40"])
    with pytest.raises(ValueError, match="validation_offset to at least 80"):
        with_run_sources(overlapping, tmp_path)
    elsewhere = load_config(None,
                            ["data.regenerate.validation_prompts=[spec-bench]", "eval.prompts=mt-bench"])
    assert with_run_sources(elsewhere, tmp_path).data.regenerate.validation_offset == 0
