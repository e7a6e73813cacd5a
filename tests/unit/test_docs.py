"""The docs say only what exists, and README stays a page a user reads in five minutes.

Over README.md and every docs/**/*.md, in code spans and fenced blocks:
- every `draftsmith <subcommand>` is a subcommand of the CLI (train/cli.py `build_parser`), and every `--flag`
  after it is one of that subcommand's;
- a `--flag` given to a script (`python scripts/...py`, `bash scripts/...sh`) appears in that script's source;
  any other `--flag` is a draftsmith flag or another tool's listed in `OTHER_TOOLS`;
- every dotted config key (`train.max_minutes`, `drafter.eagle3.ttt_steps`) is a key of the resolved config of
  some drafter kind.
Every relative link resolves to a file or folder and carries no anchor (anchors break silently). README.md is
at most 250 lines, and Install, "Your model" and Serving start within its first 120. The results pages equal
what scripts/bench/results_pages.py generates from the committed JSON (each campaign folder's page.py renders
its own), and every campaign JSON records its command and host.
"""

from __future__ import annotations

import argparse
import functools
import re
from pathlib import Path

import pytest
from helpers import load_script

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SECTIONS = ("model", "data", "drafter", "extract", "train", "export", "eval", "plan", "log")
# flags of other tools the docs show (not draftsmith's, so not checkable here)
OTHER_TOOLS = {
    "accelerate": {"--config_file", "--machine_rank", "--main_process_ip", "--main_process_port",
                   "--multi_gpu", "--num_processes", "--num_machines", "--cpu", "--use_fsdp",
                   "--fsdp_version"},
    "torchrun": {"--nproc_per_node"},
    "pip": {"--index-url"},
    "vllm": {"--speculative-config", "--host", "--port", "--enforce-eager", "--dtype"},
    "FasterDecoding/Medusa": {"--model"},
    "sglang": {"--model-path", "--speculative-algorithm", "--speculative-draft-model-path",
               "--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens"},
    "pytest-randomly": {"--randomly-seed"},
    "llama.cpp": {"--spec-type", "--target-model-dir", "--no-repack", "--metrics", "--spec-draft-sampling",
                  "--spec-draft-model", "--spec-draft-n-max", "--spec-draft-p-min"},
}
# the docs show it as an old key that fails, naming its new place
NAMED_AS_INVALID = {"drafter.eagle_ttt_steps"}
FILE_SUFFIXES = {"py", "yaml", "json", "jsonl", "md", "sh", "safetensors", "txt", "gz", "sbatch", "pt"}
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9_-]*")
INVOCATION = re.compile(r"(?:^|[\s/])draftsmith(?:\.train)?\s+([a-z][a-z-]*)")
SCRIPT = re.compile(r"(?:^|\s)(?:python3?|bash|sbatch)\s+(scripts/[\w/.-]+\.(?:py|sh|sbatch))")
KEY = re.compile(rf"(?<![\w./$-])(?:{'|'.join(SECTIONS)})(?:\.[a-z_][a-z0-9_]*)+")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
SPAN = re.compile(r"`([^`\n]+)`")
QUOTED = re.compile(r"'[^'\n]*'|\"[^\"\n]*\"")


def code_of(text: str) -> list[str]:
    """The fenced blocks and the inline code spans of a markdown page."""
    blocks = FENCE.findall(text)
    return blocks + SPAN.findall(FENCE.sub("", text))


def segments(code: str) -> list[str]:
    """Shell commands of a code text: continued lines joined, comments dropped, split at && ; and pipes (a
    table's escaped `\\|` is an alternative, not a pipe); quoted text is an argument, not commands (a
    `--note '...; ...'`)."""
    code = QUOTED.sub("''", code.replace("\\|", " OR ").replace("\\\n", " "))
    lines = [re.sub(r"(^|\s)#.*", "", line) for line in code.splitlines()]
    return [s for line in lines for s in re.split(r"&&|;|\|", line) if s.strip()]


@functools.cache
def cli() -> dict[str, set[str]]:
    from draftsmith.train.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: {opt for action in p._actions for opt in action.option_strings}
            for name, p in sub.choices.items()}


@functools.cache
def config_keys() -> frozenset[str]:
    """Every dotted key (and prefix) of the resolved config, over every drafter kind's section."""
    from draftsmith.heads.registry import KINDS
    from draftsmith.train.config import load_config

    keys: set[str] = set()

    def walk(tree: dict, prefix: str) -> None:
        for key, value in tree.items():
            keys.add(prefix + key)
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")

    for kind in KINDS:
        walk(load_config(None, [f"drafter.kind={kind}"]).to_dict(), "")
    return frozenset(keys)


def problems_in(page: Path) -> list[str]:
    commands, found = cli(), []
    every_flag = set().union(*commands.values(), *OTHER_TOOLS.values())
    for code in code_of(page.read_text()):
        for seg in segments(code):
            call, script = INVOCATION.search(seg), SCRIPT.search(seg)
            if call:
                sub = call.group(1)
                if sub not in commands:
                    found.append(f"`draftsmith {sub}`: no such subcommand")
                    continue
                rest = seg[call.end():]
                # `draftsmith launch PRESET -- STAGE ...`: the stage's flags
                if sub == "launch" and " -- " in rest:
                    rest, stage = rest.split(" -- ", 1)
                    seg = f"draftsmith {stage.strip()}"
                    inner = INVOCATION.search(seg)
                    if inner and inner.group(1) in commands:
                        found += [f"`draftsmith {inner.group(1)} {f}`: no such flag"
                                  for f in FLAG.findall(seg[inner.end():])
                                  if f not in commands[inner.group(1)]]
                found += [f"`draftsmith {sub} {f}`: no such flag" for f in FLAG.findall(rest)
                          if f not in commands[sub]]
            elif script:
                source = (ROOT / script.group(1)).read_text() if (ROOT / script.group(1)).is_file() else None
                if source is None:
                    found.append(f"{script.group(1)}: no such script")
                    continue
                found += [f"{script.group(1)} {f}: the script never mentions it"
                          for f in FLAG.findall(seg[script.end():])
                          if f not in source]
            else:
                found += [f"{f}: neither a draftsmith flag nor in OTHER_TOOLS" for f in FLAG.findall(seg)
                          if f not in every_flag]
        for m in KEY.finditer(code):
            after, last = code[m.end():m.end() + 1], m.group(0).rsplit(".", 1)[1]
            if after == "(" or last in FILE_SUFFIXES or m.group(0) in NAMED_AS_INVALID:
                continue
            if m.group(0) not in config_keys():
                found.append(f"config key {m.group(0)}: not in the resolved config of any kind")
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_flag_and_config_key_named_exists(page):
    assert problems_in(page) == []


def bad_links(page: Path) -> list[str]:
    """Relative links (outside code) that carry an anchor or name no file or folder."""
    text = SPAN.sub("", FENCE.sub("", page.read_text()))
    links = [link for link in LINK.findall(text) if not re.match(r"[a-z]+:", link)]
    return [link for link in links if "#" in link or not (page.parent / link).exists()]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_without_an_anchor(page):
    assert bad_links(page) == []


def test_readme_is_a_five_minute_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250
    starts = {title: next((i + 1 for i, line in enumerate(lines) if line.startswith(f"## {title}")), None)
              for title in ("Install", "Your model", "Serving")}
    assert all(start is not None and start <= 120 for start in starts.values()), starts


def test_the_checks_catch_what_they_claim(tmp_path):
    """Negative twin: a page naming a missing subcommand, a missing flag, a missing key and a broken link
    fails."""
    page = tmp_path / "bad.md"
    page.write_text("`draftsmith frobnicate`\n```bash\ndraftsmith plan --drafter D --no-such-flag\n```\n"
                    "`train.no_such_key=1` and `drafter.eagle3.ttt_steps=3`; see [a](missing.md), "
                    "[b](bad.md#part), [c](bad.md)\n")
    assert sorted(problems_in(page)) == ["`draftsmith frobnicate`: no such subcommand",
                                         "`draftsmith plan --no-such-flag`: no such flag",
                                         "config key train.no_such_key: not in the resolved config of any "
                                         "kind"]
    assert bad_links(page) == ["missing.md", "bad.md#part"]


def test_results_pages_are_generated_from_the_committed_json(tmp_path):
    pages = load_script("results_pages")
    results = ROOT / "docs" / "results"
    written = pages.write_pages(tmp_path)
    for path in written:
        committed = results / path.name
        assert committed.is_file() and committed.read_text() == path.read_text(), \
            f"docs/results/{path.name} is stale: run python scripts/bench/results_pages.py"
    generated = {p.name for p in written}
    assert {p.name for p in results.glob("*.md")} == generated  # no page without its JSON
    # no JSON without its page
    assert {p.stem for p in (results / "data").glob("*.json")} <= set(pages.pages())
    for name, data in pages.load().items():
        assert data.get("command") and data.get("host",
                                                {}).get("device"), (f"data/{name}.json: command and host")


def test_a_quoted_argument_is_not_split_into_commands():
    """A results page's command carries `--note '...; ...'`: the `;` inside quotes ends no command, while one
    outside quotes still does (the twin)."""
    quoted = "python scripts/bench/engine_served/engine_served.py OUT --note 'trained here; alone' --note 'b'"
    assert len(segments(quoted)) == 1
    assert len(segments("python scripts/bench/engine_served/engine_served.py OUT --note a; --note b")) == 2


def test_a_pages_command_names_its_notes_instead_of_repeating_them():
    """A note with code spans inside the command's own code span would break it: the page shows `(note N)` for
    each `--note` that is listed below; an argument that is not one of the notes stays as recorded (the
    twin)."""
    from draftsmith.eval.measure.campaign import shown_command as shown

    command = "python scripts/bench/x.py OUT --note 'run `draftsmith eval`; alone' --flag 'run `a`'"
    assert shown(command, ["run `draftsmith eval`; alone"]) == \
        "python scripts/bench/x.py OUT --note '(note 1)' --flag 'run `a`'"
    assert shown(command, []) == command
