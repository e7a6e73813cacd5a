"""Prompts and conversations -> tokenised examples (distill/data.py).

Loss masks cover exactly the assistant tokens (checked by decoding them), every record shape and
file type loads, bad records are skipped and counted instead of crashing a run, the train/validation
split is a pure function of record ids, truncation is reported, and every vendored corpus is clean.
"""

import gzip
import json
import random

import pytest
from helpers import THINKING_TEMPLATE, build_tiny_tokenizer

from draftsmith.distill.data import (
    DataConfig,
    auto_max_length,
    auto_val_count,
    build_datasets,
    encode_conversation,
    split_of,
    with_system,
)
from draftsmith.distill.records import NAMED_SOURCES, DataStats, load_records
from draftsmith.distill.target import apply_chat_template

EOT = "<|im_end|>"


def _masked_spans(tokenizer, ids, mask) -> list[str]:
    """Decoded text of each contiguous run of mask == 1."""
    spans, run = [], []
    for token, m in zip(ids + [None], mask + [0]):
        if m:
            run.append(token)
        elif run:
            spans.append(tokenizer.decode(run, skip_special_tokens=False))
            run = []
    return spans


def _write_jsonl(path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def _chat(user: str, answer: str, rid: str | None = None) -> dict:
    rec = {"conversation": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]}
    return rec if rid is None else {"id": rid, **rec}


# --- loss masks -----------------------------------------------------------------------------------

def test_mask_is_exactly_the_assistant_answer(tiny_tokenizer):
    messages = [{"role": "user", "content": "What is 2+2? Answer briefly."},
                {"role": "assistant", "content": "It is 4, of course."}]
    ids, mask = encode_conversation(tiny_tokenizer, messages)
    assert len(ids) == len(mask) and set(mask) == {0, 1}
    assert _masked_spans(tiny_tokenizer, ids, mask) == ["It is 4, of course." + EOT]
    unmasked = tiny_tokenizer.decode([t for t, m in zip(ids, mask) if not m], skip_special_tokens=False)
    # system (the template's default), user and template text are all outside the mask
    assert "SmolLM" in unmasked and "What is 2+2?" in unmasked and "<|im_start|>assistant\n" in unmasked
    assert unmasked.endswith("\n")  # the newline after <|im_end|> is template, not a target


def test_multi_turn_masks_both_answers_only(tiny_tokenizer):
    messages = with_system([
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "first answer"},
        {"role": "user", "content": "second question"},
        {"role": "assistant", "content": "second\nanswer with ünïcode"},
    ], "Be terse.")
    ids, mask = encode_conversation(tiny_tokenizer, messages)
    assert (_masked_spans(tiny_tokenizer, ids, mask) == ["first answer" + EOT,
                                                         "second\nanswer with ünïcode" + EOT])
    masked_text = tiny_tokenizer.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=False)
    for text in ("Be terse.", "question", "user", "system", "<|im_start|>"):
        assert text not in masked_text


def test_explicit_eos_ids_and_no_eos_give_the_same_span(tiny_tokenizer):
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert encode_conversation(tiny_tokenizer, messages) == encode_conversation(
        tiny_tokenizer, messages, eos_ids={tiny_tokenizer.convert_tokens_to_ids(EOT)})


def test_assistant_first_is_refused_not_mislocated(tiny_tokenizer):
    # there is no prompt to render before the answer (and with a system turn the template's default
    # system prompt would make the prefix unstable): refuse rather than mask the wrong tokens
    with pytest.raises(ValueError):
        encode_conversation(tiny_tokenizer, [{"role": "assistant", "content": "Hi!"},
                                             {"role": "user", "content": "hello"}])


# --- reasoning targets: thinking-mode templates -----------------------------------------------------------

def thinking_tokenizer(**variables):
    tokenizer = build_tiny_tokenizer()
    apply_chat_template(tokenizer, THINKING_TEMPLATE, "tiny-thinking", variables)
    return tokenizer


def test_template_variables_reach_every_render():
    """model.chat_template_kwargs ({enable_thinking: false} here) shape the generation prompt the eval, the
    engines and regeneration render (Target.chat_ids) and the chats training renders."""
    from draftsmith.distill.data import render_chat

    hi = [{"role": "user", "content": "hi"}]  # what Target.chat_ids renders
    off = render_chat(thinking_tokenizer(enable_thinking=False), hi, add_generation_prompt=True)
    on = render_chat(thinking_tokenizer(), hi, add_generation_prompt=True)
    assert off[: len(on)] == on
    assert thinking_tokenizer().decode(off[len(on):]) == "<think>\n\n</think>\n\n"
    with pytest.raises(ValueError, match="chat_template_kwargs must be a mapping"):
        apply_chat_template(build_tiny_tokenizer(), None, "t", "enable_thinking")


def test_a_reasoning_chat_learns_the_last_turn_with_its_thinking():
    """Qwen3-style templates drop an earlier turn's thinking once a later user turn follows: that turn is not
    shown as the target wrote it and stays out of the mask; the last turn is learned with its thinking, given
    as `reasoning_content` or inside the content."""
    tokenizer = thinking_tokenizer()
    for last in ({"role": "assistant", "content": "four", "reasoning_content": "2+2=4"},
                 {"role": "assistant", "content": "<think>\n2+2=4\n</think>\n\nfour"}):
        messages = [{"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "hello", "reasoning_content": "greet back"},
                    {"role": "user", "content": "2+2?"}, last]
        ids, mask = encode_conversation(tokenizer, messages)
        assert _masked_spans(tokenizer, ids, mask) == ["<think>\n2+2=4\n</think>\n\nfour" + EOT]
        assert "greet back" not in tokenizer.decode(ids)  # the earlier thinking is gone from the chat


def test_records_keep_an_assistant_turns_thinking(tmp_path):
    path = _write_jsonl(tmp_path / "r.jsonl", [{"id": "a", "messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "reasoning_content": "because", "thinking": "harmony"}]}])
    records, _ = load_records([path], stats=DataStats())
    assert records[0]["messages"][1] == {"role": "assistant", "content": "a", "reasoning_content": "because",
                                         "thinking": "harmony"}


def test_the_tokenised_cache_tells_template_variables_apart(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_TOKENIZED", str(tmp_path / "tok"))
    cfg = DataConfig(train=[_write_jsonl(tmp_path / "d.jsonl", _conversations(5))], val_fraction=0.0)
    on = build_datasets(cfg, thinking_tokenizer())
    off = build_datasets(cfg, thinking_tokenizer(enable_thinking=False))
    assert on[2].cache.startswith("written") and off[2].cache.startswith("written")
    assert build_datasets(cfg, thinking_tokenizer())[2].cache.startswith("hit")


@pytest.mark.slow
@pytest.mark.ci
def test_reference_tokenizer_masks(reference_dir):
    """The same property on SmolLM2's real tokenizer (the fixture prepares the preset when needed)."""
    from transformers import AutoTokenizer

    folder = reference_dir
    tok = AutoTokenizer.from_pretrained(folder)
    messages = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."},
                {"role": "user", "content": "Another?"}, {"role": "assistant", "content": "Green, then red."}]
    ids, mask = encode_conversation(tok, messages)
    assert _masked_spans(tok, ids, mask) == ["Blue." + EOT, "Green, then red." + EOT]


# --- records --------------------------------------------------------------------------------------

def test_record_shapes(tmp_path):
    path = _write_jsonl(tmp_path / "mix.jsonl", [
        {"id": "t", "turns": ["one", "two"], "category": "qa"},
        {"question_id": 7, "prompt": "single prompt"},
        {"id": "c", "conversation": [{"role": "system", "content": "sys"}, {"role": "user", "content": "u"},
                                     {"role": "assistant", "content": "a"}]},
        {"messages": [{"role": "user", "content": "m"}, {"role": "assistant", "content": "n"}]},
    ])
    records, stats = load_records(path)
    assert [r["id"] for r in records] == ["t", "7", "c", "mix.jsonl:3"]
    assert records[0]["messages"] == [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}]
    assert records[0]["category"] == "qa" and records[1]["category"] == ""
    assert records[1]["messages"] == [{"role": "user", "content": "single prompt"}]
    assert [m["role"] for m in records[2]["messages"]] == ["system", "user", "assistant"]
    assert records[3]["messages"][1] == {"role": "assistant", "content": "n"}
    assert (stats.read, stats.kept, stats.malformed, stats.empty) == (4, 4, 0, 0)


def test_bad_records_are_skipped_and_counted(tmp_path):
    path = _write_jsonl(tmp_path / "bad.jsonl", [
        {"id": "good1", "prompt": "fine"},
        '{"id": "broken", "turns": ["never closed"',  # invalid json
        {"id": "none"},  # no turns / prompt / conversation
        {"id": "empty-list", "turns": []},
        {"id": "blank-turn", "turns": ["ok", "   "]},
        {"id": "int-turns", "turns": 5},
        {"id": "mixed-turns", "turns": ["ok", 3]},
        {"id": "bad-role", "conversation": [{"role": "bot", "content": "x"}]},
        {"id": "bad-content", "conversation": [{"role": "user", "content": None}]},
        {"id": "conv-str", "conversation": "not a list"},
        [1, 2, 3],  # not an object
        "",  # blank line: ignored, not a record
        {"id": "good2",
         "conversation": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]},
    ])
    records, stats = load_records(path)
    assert [r["id"] for r in records] == ["good1", "good2"]
    assert stats.read == 12 and stats.kept == 2
    assert stats.malformed == 8 and stats.empty == 2
    assert stats.reasons["invalid json or utf-8"] == 1 and stats.reasons["empty turn"] == 2
    assert (stats.reasons["unknown role 'bot'"] == 1
            and stats.examples["unknown role 'bot'"] == ["bad.jsonl:8"])
    assert ("2/12 records kept, 8 malformed, 2 empty" in stats.summary()
            and "e.g. bad.jsonl:" in stats.summary())


def test_limit_and_categories(tmp_path):
    path = _write_jsonl(tmp_path / "c.jsonl", [{"id": str(i), "prompt": f"p{i}", "category": "ab"[i % 2]}
                                               for i in range(10)])
    assert [r["id"] for r in load_records(path, limit=3)[0]] == ["0", "1", "2"]
    assert [r["id"] for r in load_records(path, categories=["b"], limit=2)[0]] == ["1", "3"]


def test_json_and_parquet_load_through_datasets(tmp_path):
    import datasets

    rows = [{"id": "a", "turns": ["x", "y"]}, {"id": "b", "prompt": "z"}, _chat("u", "v", rid="c")]
    (tmp_path / "list.json").write_text(json.dumps(rows))
    (tmp_path / "wrapped.json").write_text(json.dumps({"version": 1, "data": rows}))
    # JSON Lines named .json
    (tmp_path / "lines.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    columns = {key: [r.get(key) for r in rows] for key in ("id", "turns", "prompt", "conversation")}
    datasets.Dataset.from_dict(columns).to_parquet(str(tmp_path / "rows.parquet"))
    for name in ("list.json", "wrapped.json", "lines.json", "rows.parquet"):
        # datasets gives every row every column (None where absent): still the right record shapes
        records, stats = load_records(str(tmp_path / name))
        assert [r["id"] for r in records] == ["a", "b", "c"], name
        assert [len(r["messages"]) for r in records] == [2, 1, 2], name
        assert stats.malformed == 0, name


def test_unknown_source_and_file_type(tmp_path):
    with pytest.raises(FileNotFoundError, match="spec-bench"):
        load_records("no-such-corpus")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match="unsupported"):
        load_records(str(tmp_path / "x.csv"))


@pytest.mark.parametrize("name", sorted(NAMED_SOURCES))
def test_every_vendored_corpus_loads_clean(name):
    records, stats = load_records(name)
    assert records and stats.malformed == 0 and stats.empty == 0 and stats.kept == stats.read == len(records)
    assert len({r["id"] for r in records}) == len(records)  # ids are unique within a corpus


def test_gzipped_jsonl(tmp_path):
    path = tmp_path / "p.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write(json.dumps({"id": "g", "prompt": "zipped"}) + "\n")
    assert load_records(str(path))[0][0]["messages"][0]["content"] == "zipped"


# --- datasets -------------------------------------------------------------------------------------

def _conversations(n: int) -> list[dict]:
    return [_chat(f"question number {i}", f"answer number {i} " + "x" * (i % 7), rid=f"r{i}")
            for i in range(n)]


def test_build_datasets_rows(tmp_path, tiny_tokenizer):
    path = _write_jsonl(tmp_path / "d.jsonl",
                        _conversations(6) + [{"id": "prompt-only", "prompt": "no answer"}])
    train, val, stats = build_datasets(DataConfig(train=[path], val_fraction=0.0), tiny_tokenizer)
    assert len(val) == 0 and len(train) == 6 and stats.kept == 6
    assert stats.reasons == {"no assistant turn (run regenerate first)": 1}
    row = train[0]
    assert set(row) == {"id", "input_ids", "loss_mask"} and len(row["input_ids"]) == len(row["loss_mask"])
    assert _masked_spans(tiny_tokenizer, row["input_ids"], row["loss_mask"]) == ["answer number 0 " + EOT]


def test_split_is_deterministic_and_order_independent(tmp_path, tiny_tokenizer):
    rows = _conversations(40)
    shuffled = rows[:]
    random.Random(0).shuffle(shuffled)
    cfg = lambda p: DataConfig(train=[p], val_fraction=0.3)  # noqa: E731
    a = build_datasets(cfg(_write_jsonl(tmp_path / "a.jsonl", rows)), tiny_tokenizer)
    b = build_datasets(cfg(_write_jsonl(tmp_path / "a.jsonl", rows)), tiny_tokenizer)
    c = build_datasets(cfg(_write_jsonl(tmp_path / "c.jsonl", shuffled)), tiny_tokenizer)
    val_ids = sorted(a[1]["id"])
    assert 0 < len(val_ids) < 40 and len(a[0]) + len(val_ids) == 40
    assert val_ids == sorted(b[1]["id"]) == sorted(c[1]["id"])
    assert sorted(a[0]["id"]) == sorted(c[0]["id"])
    assert all(split_of(i, 0.3) == "validation" for i in val_ids)
    assert split_of("anything", 0.0) == "train"


def test_truncation_is_counted_and_reported(tmp_path, tiny_tokenizer):
    long = _chat("short question", "a long answer " * 20, rid="long")
    # the system turn alone is ~90 tokens: with max_length 120 this answer is all cut away
    gone = _chat("q " * 40, "lost answer", rid="gone")
    path = _write_jsonl(tmp_path / "t.jsonl", [long, gone, _chat("q", "ok", rid="fits")])
    train, _, stats = build_datasets(DataConfig(train=[path], max_length=120, val_fraction=0.0),
                                     tiny_tokenizer)
    assert stats.truncated == 2 and "max_length 120 (data.max_length); 2 of 3 truncated" in stats.summary()
    assert stats.reasons == {"no assistant tokens within max_length": 1}
    lengths = dict(zip(train["id"], map(len, train["input_ids"])))
    assert lengths["long"] == 120 and lengths["fits"] < 120 and "gone" not in lengths


def test_auto_max_length_is_a_percentile_of_the_lengths_capped_by_the_target():
    lengths = list(range(1, 101))  # 1..100 tokens
    # 99 -> a multiple of 8
    assert auto_max_length("auto", lengths, None) == (104, "p99 of 100 conversations")
    assert auto_max_length("p50", lengths, None) == (56, "p50 of 100 conversations")
    assert auto_max_length("p100", lengths, 1024) == (104, "p100 of 100 conversations")
    assert (auto_max_length("auto", lengths,
                            64) == (64, "p99 of 100 conversations, capped by the target's 64 positions"))
    assert auto_max_length("auto", [30] * 3, None) == (32, "p99 of 3 conversations")


@pytest.mark.parametrize("value", ["p0", "p101", "big", "99", 0])
def test_max_length_rules_that_mean_nothing_fail(value):
    with pytest.raises(ValueError, match="data.max_length"):
        DataConfig(max_length=value)


def test_max_length_auto_fits_the_data_and_reports_it(tmp_path, tiny_tokenizer):
    rows = [_chat(f"q{i}", "answer " * (5 + i), rid=f"r{i}") for i in range(30)]
    path = _write_jsonl(tmp_path / "a.jsonl", rows)
    train, _, stats = build_datasets(DataConfig(train=[path], max_length="auto", val_fraction=0.0),
                                     tiny_tokenizer, max_positions=4096)
    lengths = list(map(len, train["input_ids"]))
    longest = max(lengths)
    assert stats.truncated == 0 and longest <= stats.max_length < longest + 8
    assert f"max_length {stats.max_length} (p99 of 30 conversations); 0 of 30 truncated" in stats.summary()
    # the target's positions cap it: every conversation longer than them is cut, and the line says so
    train, _, capped = build_datasets(DataConfig(train=[path], max_length="auto", val_fraction=0.0),
                                      tiny_tokenizer, max_positions=250)
    cut = sum(n > 250 for n in lengths)
    assert (capped.max_length == 250 and max(map(len, train["input_ids"])) == 250
            and capped.truncated == cut > 0)
    assert f"capped by the target's 250 positions); {cut} of 30 truncated" in capped.summary()


def test_val_fraction_auto_holds_out_a_few_even_from_small_data(tmp_path, tiny_tokenizer):
    assert [auto_val_count(n) for n in (3, 16, 30, 1000, 10**6)] == [0, 4, 4, 20, 1000]
    rows = _conversations(30)
    shuffled = rows[:]
    random.Random(1).shuffle(shuffled)
    a = build_datasets(DataConfig(train=[_write_jsonl(tmp_path / "a.jsonl", rows)], val_fraction="auto"),
                       tiny_tokenizer)
    b = build_datasets(DataConfig(train=[_write_jsonl(tmp_path / "b.jsonl", shuffled)], val_fraction="auto"),
                       tiny_tokenizer)
    # by id, not by order
    assert len(a[1]) == 4 and len(a[0]) == 26 and sorted(a[1]["id"]) == sorted(b[1]["id"])
    # the fixed fraction of the same 30 may hold out none: what `auto` is for
    assert DataConfig(val_fraction="auto").val_fraction == "auto"
    with pytest.raises(ValueError, match="val_fraction"):
        DataConfig(val_fraction=1.0)


def test_validation_sources_replace_the_held_out_share(tmp_path, tiny_tokenizer):
    """data.validation: every training conversation trains (val_fraction unused), the named sources validate,
    a training conversation asking a validation prompt is left out (it would be seen twice), and the limit
    counts only training conversations; the split is part of the tokenised cache's key."""
    train_path = _write_jsonl(tmp_path / "t.jsonl",
                              _conversations(20) + [_chat("held prompt 1", "seen twice", "dup")])
    held = [_chat(f"held prompt {i}", f"held answer {i}", rid=f"h{i}") for i in range(5)]
    val_path = _write_jsonl(tmp_path / "v.jsonl", held + [{"id": "h-empty", "prompt": "no answer"}])
    train, val, stats = build_datasets(DataConfig(train=[train_path], validation=[val_path],
                                                  val_fraction=0.3),
                                       tiny_tokenizer)
    assert sorted(val["id"]) == [f"h{i}" for i in range(5)]
    assert sorted(train["id"]) == sorted(f"r{i}" for i in range(20)) and "dup" not in train["id"]
    assert ("validation: 5 conversations from data.validation; 1 training conversations asking one of their "
            "prompts left out" in stats.summary())
    assert stats.reasons == {"no assistant turn (run regenerate first)": 1}
    _, val_spans = val[0]["input_ids"], _masked_spans(tiny_tokenizer, val[0]["input_ids"],
                                                      val[0]["loss_mask"])
    assert val_spans == ["held answer 0" + EOT]
    limited, val2, _ = build_datasets(DataConfig(train=[train_path], validation=[val_path], limit=7),
                                      tiny_tokenizer)
    assert len(limited) == 7 and len(val2) == 5
    plain = build_datasets(DataConfig(train=[train_path], val_fraction=0.3), tiny_tokenizer)
    assert "h0" not in plain[1]["id"] and len(plain[0]) + len(plain[1]) == 21


def test_validation_conversations_are_whole_and_leave_max_length_to_the_training_data(tmp_path,
                                                                                      tiny_tokenizer):
    """Validation conversations are judged as eval sees them: not cut by data.max_length (only by the target's
    positions), and `auto` sizes from the training conversations alone."""
    train_path = _write_jsonl(tmp_path / "t.jsonl", [_chat(f"q{i}", "short", rid=f"r{i}") for i in range(10)])
    val_path = _write_jsonl(tmp_path / "v.jsonl", [_chat("long q", "word " * 200, rid="long")])
    alone = build_datasets(DataConfig(train=[train_path], max_length="auto", val_fraction=0.0),
                           tiny_tokenizer)[2]
    _, val, stats = build_datasets(DataConfig(train=[train_path], validation=[val_path], max_length="auto"),
                                   tiny_tokenizer, max_positions=4096)
    assert stats.max_length == alone.max_length < len(val[0]["input_ids"]) and stats.truncated == 0
    _, val, _ = build_datasets(DataConfig(train=[train_path], validation=[val_path], max_length=64),
                               tiny_tokenizer, max_positions=150)
    assert len(val[0]["input_ids"]) == 150  # the target's positions still bound it


def test_template_errors_are_counted_not_raised(tmp_path):
    strict = build_tiny_tokenizer()
    strict.chat_template = (  # a Mistral/Gemma-like template that refuses two user turns in a row
        "{% for m in messages %}{% if loop.index0 > 0 and m['role'] == messages[loop.index0 - 1]['role'] %}"
        "{{ raise_exception('roles must alternate') }}{% endif %}"
        "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    twice = {"id": "twice",
             "conversation": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
                                             {"role": "assistant", "content": "c"}]}
    first = {"id": "first", "conversation": [{"role": "assistant", "content": "hello"},
                                             {"role": "user", "content": "hi"},
                                             {"role": "assistant", "content": "x"}]}
    path = _write_jsonl(tmp_path / "s.jsonl", [twice, _chat("u", "v", rid="ok"), first])
    train, _, stats = build_datasets(DataConfig(train=[path], val_fraction=0.0), strict)
    assert train["id"] == ["ok"] and stats.malformed == 2 and stats.reasons["template error"] == 2


def test_data_config_validates_val_fraction():
    with pytest.raises(ValueError, match="val_fraction"):
        DataConfig(val_fraction=1.0)


def test_stats_to_dict():
    stats = DataStats()
    stats.skip("empty", "empty turn")
    assert stats.to_dict()["empty"] == 1 and stats.to_dict()["reasons"] == {"empty turn": 1}


# --- data as people have it ----------------------------------------------------------------------------

SHAREGPT = {"id": "sg",
            "conversations": [{"from": "system", "value": "Be kind."}, {"from": "human", "value": "hi"},
                                          {"from": "gpt", "value": "hello"}]}
SPECFORGE = {"id": "sf",
             "conversations": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
ALPACA = {"instruction": "Translate", "input": "Hallo", "output": "Hello"}


def test_every_record_format_reads_as_messages(tmp_path):
    path = _write_jsonl(tmp_path / "formats.jsonl",
                        [SHAREGPT, SPECFORGE, ALPACA, {"instruction": "Only asked"}])
    records, stats = load_records(path)
    assert records[0]["messages"] == [{"role": "system", "content": "Be kind."},
                                      {"role": "user", "content": "hi"},
                                      {"role": "assistant", "content": "hello"}]
    assert records[1]["messages"][1] == {"role": "assistant", "content": "a"}
    assert records[2]["messages"] == [{"role": "user", "content": "Translate\n\nHallo"},
                                      {"role": "assistant", "content": "Hello"}]
    assert records[3]["messages"] == [{"role": "user", "content": "Only asked"}]  # an Alpaca prompt
    (tmp_path / "prompts.txt").write_text("first prompt\n\nsecond prompt\n")
    assert [r["messages"][0]["content"] for r in load_records(str(tmp_path / "prompts.txt"))[0]] == [
        "first prompt", "second prompt"]
    assert stats.kept == 4


def test_a_sharegpt_file_with_unknown_roles_names_them(tmp_path):
    bad = dict(SHAREGPT, id="x",
               conversations=[{"from": "narrator", "value": "once"}, {"from": "gpt", "value": "a"}])
    path = _write_jsonl(tmp_path / "sg.jsonl", [SHAREGPT, bad])
    records, stats = load_records(path)
    assert [r["id"] for r in records] == ["sg"] and stats.reasons == {"unknown role 'narrator'": 1}
    with pytest.raises(ValueError,
                       match=r"sg-bad.jsonl' has no usable record.*first reason: unknown role 'narrator' at "
                             r"sg-bad.jsonl:1"):
        load_records(_write_jsonl(tmp_path / "sg-bad.jsonl", [bad]))


def test_globs_folders_and_datasets_load(tmp_path):
    import datasets

    folder = tmp_path / "shards"
    folder.mkdir()
    _write_jsonl(folder / "a.jsonl", [SHAREGPT])
    _write_jsonl(folder / "b.jsonl", [SPECFORGE])
    (folder / "notes.md").write_text("not data")
    assert [r["id"] for r in load_records(str(folder))[0]] == ["sg", "sf"]
    assert [r["id"] for r in load_records(str(folder / "*.jsonl"))[0]] == ["sg", "sf"]
    saved = tmp_path / "saved"
    datasets.Dataset.from_list([dict(SPECFORGE, id=f"d{i}") for i in range(3)]).save_to_disk(str(saved))
    assert [r["id"] for r in load_records(str(saved))[0]] == ["d0", "d1", "d2"]
    source = {"path": "json", "data_files": [str(folder / "b.jsonl")], "split": "train"}
    assert [r["id"] for r in load_records([source])[0]] == ["sf"]
    with pytest.raises(FileNotFoundError, match="matches no data file"):
        load_records(str(tmp_path / "nothing-*.jsonl"))


def test_a_dataset_with_no_text_column_is_an_error_naming_it(tmp_path):
    path = _write_jsonl(tmp_path / "numbers.jsonl", [{"id": 1, "value": 3}, {"id": 2, "value": 4}])
    with pytest.raises(ValueError, match=r"numbers.jsonl' has no usable record.*no text column"):
        load_records(path)


def test_config_takes_a_dataset_mapping_and_sharegpt_trains(tmp_path, tiny_tokenizer):
    from draftsmith.train.config import load_config

    path = _write_jsonl(tmp_path / "sg.jsonl", [dict(SHAREGPT, id=f"s{i}") for i in range(4)])
    cfg = load_config(None, [f"data.train=[{{path: json, data_files: [{path}]}}]", "data.val_fraction=0"])
    train, _, stats = build_datasets(cfg.data, tiny_tokenizer)
    assert len(train) == 4 and stats.kept == 4
    assert _masked_spans(tiny_tokenizer, train[0]["input_ids"], train[0]["loss_mask"]) == ["hello" + EOT]


def test_the_tokenised_cache_is_reused(tmp_path, tiny_tokenizer, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_TOKENIZED", str(tmp_path / "tok"))
    cfg = DataConfig(train=[_write_jsonl(tmp_path / "d.jsonl", _conversations(5))], val_fraction=0.3)
    first = build_datasets(cfg, tiny_tokenizer)
    second = build_datasets(cfg, tiny_tokenizer)
    assert first[2].cache.startswith("written") and second[2].cache.startswith("hit")
    assert "tokenised cache hit" in second[2].summary()
    for a, b in zip(first[:2], second[:2]):
        assert a["input_ids"] == b["input_ids"] and a["id"] == b["id"]
    other = build_datasets(DataConfig(train=cfg.train, val_fraction=0.3, max_length=16), tiny_tokenizer)
    assert other[2].cache.startswith("written")  # another max length: another cache entry
