"""A datastore of the target's own answers for prompt lookup (`drafter.lookup_datastore`).

Prompt lookup finds continuations only in the context; where the context never said the phrase (the first
sentence of a chat answer, a formula's next line) it drafts nothing. A datastore is the same lookup in a
corpus of what the target writes: the answers it gave to other prompts (the pipeline's self-distilled data is
exactly that). For the longest suffix of the context (up to `drafter.prompt_lookup.datastore_ngram_max`
tokens) found there, it drafts the most frequent continuation of that suffix over its occurrences, token by
token (REST, He et al. 2024, and the global tree of Arctic's suffix decoding are the references; this is their
simplest form: one frequency-ranked path). Its path is merged into the prompt-lookup trie, so both are
verified in one forward; every node is a deterministic proposal, so exactness at T > 0 is the lookup trie's
(heads/runtime/verify.py treats siblings as point masses).

The index is a sorted array of 64-bit hashes of every n-gram (n = 1..ngram_max) with the position after it,
searched with `np.searchsorted`: about 12 bytes per corpus token per order, built in seconds for millions of
tokens, and rebuilt per process (nothing is written or unpickled). The data are read by the same reader as
training data (distill/records.py: a vendored name, a file, a glob, a folder), and only assistant turns count.
"""

from __future__ import annotations

import numpy as np

from draftsmith.distill.records import load_records

_BASE = 1000003
_MASK = (1 << 64) - 1


class Datastore:
    """n-gram index over token sequences: `continuation(context, k)` drafts the most frequent continuation of
    the longest suffix of `context` (at most `ngram_max` tokens) the sequences contain."""

    def __init__(self, sequences: list[list[int]], ngram_max: int = 4, max_matches: int = 512):
        if ngram_max < 1:
            raise ValueError("drafter.prompt_lookup.datastore_ngram_max must be >= 1")
        self.ngram_max, self.max_matches = ngram_max, max_matches
        corpus = []
        for seq in sequences:
            corpus.extend(seq)
            corpus.append(-1)  # a separator: no n-gram or continuation crosses from one answer into the next
        self.corpus = np.asarray(corpus, dtype=np.int32)
        self.tokens = int((self.corpus >= 0).sum())
        self.index = [self._order(n) for n in range(1, ngram_max + 1)]

    def _order(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(sorted hashes of every n-gram followed by a token, the position of that token), by hash then
        position."""
        c, L = self.corpus, len(self.corpus)
        if L <= n:
            return np.zeros(0, np.uint64), np.zeros(0, np.int64)
        h = np.zeros(L - n, dtype=np.uint64)
        valid = c[n:] >= 0
        for j in range(n):  # polynomial hash mod 2**64 (uint64 arrays wrap), the same as `key`
            part = c[j: L - n + j]
            valid &= part >= 0
            h = h * np.uint64(_BASE) + (part + 1).astype(np.uint64)
        # 12 bytes a token and order
        pos = np.arange(n, L, dtype=np.int32 if L < 2 ** 31 else np.int64)[valid]
        h = h[valid]
        order = np.argsort(h, kind="stable")
        return h[order], pos[order]

    @staticmethod
    def key(tokens) -> np.uint64:
        h = 0
        for t in tokens:
            h = (h * _BASE + int(t) + 1) & _MASK
        return np.uint64(h)

    def matches(self, context: list[int]) -> tuple[np.ndarray, int]:
        """Positions following the longest suffix of `context` found (the latest `max_matches` of them), and
        its length."""
        for n in range(min(self.ngram_max, len(context)), 0, -1):
            hashes, pos = self.index[n - 1]
            k = self.key(context[-n:])
            lo, hi = np.searchsorted(hashes, k, "left"), np.searchsorted(hashes, k, "right")
            if hi > lo:
                return pos[max(lo, hi - self.max_matches): hi], n
        return np.zeros(0, np.int64), 0

    def continuation(self, context: list[int], num_tokens: int) -> list[int]:
        """The most frequent next token over the matches, then the most frequent after it among those that
        continued so, and so on for up to `num_tokens` tokens (ties: the smaller token id)."""
        cur, _ = self.matches(context)
        out: list[int] = []
        for depth in range(num_tokens):
            if not len(cur):
                break
            nxt = self.corpus[cur + depth]
            nxt = nxt[nxt >= 0]
            if not len(nxt):
                break
            values, counts = np.unique(nxt, return_counts=True)
            best = int(values[np.argmax(counts)])
            out.append(best)
            # a match that continued with `best` is never at a separator
            cur = cur[self.corpus[cur + depth] == best]
        return out


def answers(sources) -> list[str]:
    """The assistant turns of every record in `sources` (any data the training reader takes)."""
    records, _ = load_records(list(sources))
    texts = [m["content"] for rec in records for m in rec["messages"] if m["role"] == "assistant"]
    if not texts:
        raise ValueError(f"drafter.lookup_datastore {list(sources)} holds no answers (assistant turns): give "
                         "conversations with the target's own answers, e.g. the self-distilled data the "
                         "pipeline writes (`draftsmith regenerate`) or, for the reference target, "
                         "smollm2-selfdistill-4k")
    return texts


# (sources, id(tokenizer), ngram_max) -> (tokenizer, datastore)
_BUILT: dict[tuple, tuple[object, Datastore]] = {}


def load_datastore(sources, tokenizer, ngram_max: int = 4) -> Datastore:
    """The datastore of `sources`' answers in `tokenizer`'s tokens (built once per process and settings)."""
    key = (tuple(str(s) for s in sources), id(tokenizer), ngram_max)
    if key not in _BUILT:
        ids = tokenizer(answers(sources), add_special_tokens=False)["input_ids"]
        _BUILT[key] = (tokenizer, Datastore(ids, ngram_max))  # the tokenizer is held so its id stays its own
    return _BUILT[key][1]
