"""The prompt-lookup datastore (heads/prompt_lookup/datastore.py): its index answers what a scan of the corpus
answers, nothing crosses from one answer into the next, data without answers is refused with the fix, and the
prompt-lookup trie carries its path. Losslessness with it: tests/unit/test_hybrid.py (modes "...
datastore")."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest
from helpers import build_tiny_tokenizer

from draftsmith.heads.prompt_lookup.datastore import Datastore, answers, load_datastore
from draftsmith.heads.prompt_lookup.proposer import PromptLookupProposer


def scan(sequences, context, num_tokens, ngram_max):
    """The datastore's answer by brute force: the longest suffix found, then the most frequent next token
    (ties: the smaller id) among the occurrences that continued so far."""
    for n in range(min(ngram_max, len(context)), 0, -1):
        suffix = context[-n:]
        starts = [(s, i + n) for s, seq in enumerate(sequences) for i in range(len(seq) - n)
                  if seq[i: i + n] == suffix]
        if starts:
            out = []
            for depth in range(num_tokens):
                nxt = Counter(sequences[s][p + depth] for s, p in starts if p + depth < len(sequences[s]))
                if not nxt:
                    break
                best = min(nxt, key=lambda t: (-nxt[t], t))
                out.append(best)
                starts = [(s, p) for s, p in starts if p + depth < len(sequences[s])
                          and sequences[s][p + depth] == best]
            return out
    return []


def test_continuations_equal_a_scan_of_the_corpus():
    rng = random.Random(0)
    sequences = [[rng.randrange(6) for _ in range(rng.randrange(1, 40))] for _ in range(30)]
    store = Datastore(sequences, ngram_max=3)
    assert store.tokens == sum(map(len, sequences))
    for _ in range(300):
        context = [rng.randrange(7) for _ in range(rng.randrange(1, 6))]  # 6: a token the corpus never holds
        k = rng.randrange(1, 6)
        assert store.continuation(context, k) == scan(sequences, context, k, 3), context


def test_nothing_crosses_from_one_answer_into_the_next():
    store = Datastore([[1, 2, 3], [4, 5]], ngram_max=2)
    assert store.continuation([9, 2, 3], 3) == []  # "2 3" ends the first answer: no continuation into "4 5"
    assert store.continuation([3], 2) == []
    assert store.continuation([1], 4) == [2, 3]
    assert store.continuation([8, 4], 4) == [5]


def test_data_without_answers_is_refused_with_the_fix(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(3)))
    with pytest.raises(ValueError, match="holds no answers.*assistant turns.*regenerate"):
        answers([str(prompts)])


def test_the_lookup_trie_carries_the_datastore_path(tmp_path):
    tokenizer = build_tiny_tokenizer()
    chats = tmp_path / "answers.jsonl"
    chats.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                              {"role": "assistant", "content": "abcdef"}]}) + "\n")
    store = load_datastore([str(chats)], tokenizer, 4)
    assert load_datastore([str(chats)], tokenizer, 4) is store  # built once per process
    ids = tokenizer("abcdef", add_special_tokens=False)["input_ids"]
    lookup = PromptLookupProposer(3, 3, 1, datastore=store, datastore_tokens=2)
    assert lookup.tree == "chain-3 + datastore 2"
    context = [ids[1], ids[2], ids[1]]  # the context's own match of its last token continues with ids[2]
    assert lookup.continuations(context) == [[ids[2], ids[1]], ids[2:4]]
    # a datastore path already inside a context continuation adds no node
    a, b, c, d, e = ids[:5]
    # the datastore's [d, e] is inside it
    assert lookup.continuations([a, b, c, d, e, a, b, c]) == [[d, e, a]]
