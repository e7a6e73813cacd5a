"""Shared fixtures: an offline ChatML tokenizer, tiny random Llama/Qwen2 targets saved to disk, the
training workspace (a tiny target + learnable conversations), and the test-only `bigram` drafter kind
(`bigram_kind/`), registered before collection.

The builders live in `tests/helpers.py` (importable as plain functions: `from helpers import
build_tiny_model_dir`); the fixtures here are session-scoped so the folders are written once.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `import helpers` from any test module

if os.environ.get("PYTEST_XDIST_WORKER"):  # one of scripts/test.sh's workers, one per core: one thread each
    os.environ["OMP_NUM_THREADS"] = "1"  # (the processes it starts too): 2-thread jobs side by side thrash
    torch.set_num_threads(1)

import bigram_kind  # noqa: E402, F401  (the test kind registers on import, before collection: every test

# parametrised over KINDS runs it too)
from helpers import build_tiny_model_dir, build_tiny_tokenizer, write_pattern_conversations  # noqa: E402


@pytest.fixture(autouse=True)
def one_engine_at_a_time(request, tmp_path_factory):
    """The engine tests run one at a time across scripts/test.sh's workers (a lock in the folder the workers'
    temporary folders share): each starts an engine server that takes cores and gigabytes of its own, and
    they share the files converted for the engines. (xdist's `--dist loadgroup` would say it more simply, but
    xdist 3.8 names the groups through an attribute pytest 9 no longer reads: it groups nothing.)"""
    if request.node.get_closest_marker("engine") is None:
        yield
        return
    from draftsmith.distill.cache import held_lock

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the run's folder, above every worker's own
    with held_lock(shared / "engine-tests.lock"):
        yield


@pytest.fixture(scope="session", autouse=True)
def tokenized_cache(tmp_path_factory):
    """The tokenised-dataset cache of the tests: a temporary folder, never the user's."""
    folder = tmp_path_factory.mktemp("tokenized")
    old = os.environ.get("DRAFTSMITH_TOKENIZED")
    os.environ["DRAFTSMITH_TOKENIZED"] = str(folder)
    yield folder
    if old is None:
        os.environ.pop("DRAFTSMITH_TOKENIZED", None)
    else:
        os.environ["DRAFTSMITH_TOKENIZED"] = old


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """Byte-level ChatML tokenizer (vocab 259; `<|im_end|>` = eos = pad)."""
    return build_tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_models_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny-models")


@pytest.fixture(scope="session")
def tiny_llama_dir(tiny_models_root) -> Path:
    """Folder with a 2-layer tiny Llama + tokenizer, loadable with `load_target(str(folder))`."""
    return build_tiny_model_dir(tiny_models_root, "llama", layers=2)


@pytest.fixture(scope="session")
def tiny_qwen_dir(tiny_models_root) -> Path:
    """Folder with a 2-layer tiny Qwen2 + tokenizer."""
    return build_tiny_model_dir(tiny_models_root, "qwen2", layers=2)


@pytest.fixture(scope="session")
def tiny_target(tiny_llama_dir):
    """The tiny Llama loaded as a frozen fp32 CPU `Target`."""
    from draftsmith.distill.loading import load_target

    return load_target(str(tiny_llama_dir), dtype="float32", device="cpu")


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    """The reference target's folder, prepared (downloaded and converted once) if it is not yet: real-model
    tests ask for it instead of depending on another test having prepared it."""
    from draftsmith.distill.loading import resolve_target

    return resolve_target("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: thread start-up costs more than the math; one thread is several times faster."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def workspace(tmp_path_factory):
    """A tiny target folder and 48 short conversations (assistant text = a fixed pattern, learnable)."""
    root = tmp_path_factory.mktemp("train")
    target = build_tiny_model_dir(root, "llama", layers=2)
    return root, target, write_pattern_conversations(root / "conversations.jsonl", 48)


@pytest.fixture(scope="session")
def vllm_ready():
    """The vLLM engine venv (`draftsmith engine install vllm`), or a skip saying how to install it."""
    from draftsmith.eval.measure import engine

    spec = engine.get_engine("vllm")
    if not spec.ready:
        pytest.skip(f"the vLLM engine venv is not installed at {spec.home}: run `draftsmith engine install "
                    "vllm`")
    return spec


@pytest.fixture(scope="session")
def llamacpp_ready():
    """llama.cpp built by `draftsmith engine install llamacpp` (about 20 minutes), or a skip saying so."""
    from draftsmith.heads import llamacpp

    if not llamacpp.ready():
        pytest.skip(f"llama.cpp is not built at {llamacpp.home()}: run `draftsmith engine install llamacpp`")
    return llamacpp.binary()
