"""The results pages: docs/results/<page>.md from docs/results/data/<page>.json, and their index
docs/results/README.md.

    python scripts/bench/results_pages.py                      regenerate every page and the index
    python scripts/bench/results_pages.py --add NAME FILE      copy a campaign script's JSON into
                                                               data/NAME.json (through the page's `slim`),
                                                               then regenerate
    python scripts/bench/results_pages.py --out DIR            write the pages elsewhere (the docs test
                                                               compares)

Each campaign folder of scripts/bench/ renders its own pages: its `page.py` holds `PAGES`, one `Page` per page
(title, summary, the command that makes its JSON, a renderer JSON -> markdown). This file only finds those,
puts each page together (`draftsmith.eval.measure.campaign.page_text`: title, date, the recorded command, host
block, tables) and writes the index, which lists every campaign folder, the folders without a page too
(`OTHER` below).
"""

import argparse
import functools
import json
import sys
from pathlib import Path

from draftsmith.eval.measure.campaign import Page, date_of, load_file, page_text, table

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parents[1]
RESULTS = ROOT / "docs" / "results"
# campaign folders without a results page: what each measures and how it is run (their JSON stays where it is
# written)
OTHER = {
    "ablations": ("training ablations on the reference target: the draft LM's distillation losses, EAGLE-3's "
                  "objectives, τ against the amount of training data; each writes its own table",
                  "`bash scripts/bench/ablations/draft_ablation.sh OUT`, `objective_ablation.sh OUT`, "
                  "`data_curve.sh OUT`"),
    "faults": ("kill -9 at random moments, full disks and corrupt shards on a tiny model, rerun and compared "
               "with an uninterrupted run", "`bash scripts/bench/faults/faults.sh OUT --trials 20`"),
    "loop_speed": ("decoder-loop speed of this tree against another (a refactor's before and after), "
                   "alternating runs",
                   "`OTHER_DS_PYTHON=/old/venv/bin/python bash scripts/bench/loop_speed/loop_speed.sh OUT`"),
    "serving_speed": ("does drafting pay on this machine: the drafters with their plans beside plain "
                      "decoding and HF, the benchmark sweep of the recipes, how large a tree pays, prompt "
                      "lookup's datastore settings",
                      "`bash scripts/bench/serving_speed/bench_pay.sh OUT DRAFTER_DIR ...`"),
    "training_cost": ("what a training step of a recipe costs in its parts, the feature store's peak memory, "
                      "the sizing table of docs/training-at-scale.md",
                      "`python scripts/bench/training_cost/step_cost.py OUT.json -c RECIPE`"),
}


@functools.cache
def campaigns() -> dict[str, dict[str, Page]]:
    """Every campaign folder with a page.py and its pages, in folder order."""
    return {folder.name: load_file(folder / "page.py", f"{folder.name}_page").PAGES
            for folder in sorted(BENCH.iterdir()) if (folder / "page.py").is_file()}


def pages() -> dict[str, Page]:
    """Every page by name, over every campaign folder."""
    return {name: page for own in campaigns().values() for name, page in own.items()}


def load(results: Path = RESULTS) -> dict[str, dict]:
    """Every page that has a JSON, in folder order."""
    return {n: json.loads((results / "data" / f"{n}.json").read_text()) for n in pages()
            if (results / "data" / f"{n}.json").is_file()}


def index(datasets: dict[str, dict]) -> str:
    rows = [[f"[{page.title}]({name}.md)", page.summary, date_of(datasets[name]),
             (datasets[name].get("host") or {}).get("device", "–"),
             f"[{folder}/](../../scripts/bench/{folder}/)", page.command]
            for folder, own in campaigns().items() for name, page in own.items() if name in datasets]
    lines = ["# Results", "",
             "One page per measurement campaign, each generated from the JSON its script wrote (committed "
             "under [data/](data/)) by `python scripts/bench/results_pages.py` — do not edit the pages. "
             "Every page names its date, host and the exact command.", "",
             "A campaign is a folder of [scripts/bench/](../../scripts/bench/): its runner, the script that "
             "writes its JSON and `page.py`, which renders its pages; what campaigns share (the host block, "
             "the command line, run-folder readers, the paired interval, tables) is "
             "`draftsmith.eval.measure.campaign`.", ""]
    lines += table(["campaign", "what it measures", "date", "host", "folder", "command"], rows)
    lines += ["## Campaign folders without a page", "",
              "Their scripts write JSON and tables into the output folder they are given; nothing of theirs "
              "is published here.", ""]
    not_run = {folder: (f"{page.summary} (its page `{name}` is written once its JSON is added)", page.command)
               for folder, own in campaigns().items() for name, page in own.items()
               if not any(n in datasets for n in own)}
    lines += table(["folder", "what it measures", "command"],
                   [[f"[{folder}/](../../scripts/bench/{folder}/)", what, command]
                    for folder, (what, command) in sorted({**OTHER, **not_run}.items())])
    lines += ["Results measured before these pages existed were written only into the README's prose and "
              "their JSON stayed on the hosts that made them, so they are not republished here; they are in "
              "git history (`git show 35b5121:README.md`).", "",
              "Adding a campaign: a folder `scripts/bench/NAME/` whose script records `host_block()` and "
              "`command_line()` from `draftsmith.eval.measure.campaign` in its JSON, and whose `page.py` "
              "holds a `PAGES` row (title, summary, command, renderer); `python "
              "scripts/bench/results_pages.py --add PAGE OUT.json` copies the JSON into `data/PAGE.json` and "
              "writes the page."]
    return "\n".join(lines) + "\n"


def write_pages(out: Path, results: Path = RESULTS) -> list[Path]:
    """Write every page and the index into `out`; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    every, datasets, written = pages(), load(results), []
    for name, data in datasets.items():
        (out / f"{name}.md").write_text(page_text(name, every[name], data))
        written.append(out / f"{name}.md")
    (out / "README.md").write_text(index(datasets))
    return [*written, out / "README.md"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--add", nargs=2, metavar=("NAME", "FILE"),
                        help="copy a campaign JSON into data/NAME.json")
    parser.add_argument("--out", type=Path, default=RESULTS,
                        help="where to write the pages (default docs/results)")
    args = parser.parse_args()
    if args.add:
        name, source = args.add
        every = pages()
        if name not in every:
            sys.exit(f"unknown page '{name}'; known: {', '.join(every)} (add a row to a campaign's page.py "
                     "PAGES first)")
        data = every[name].slim(json.loads(Path(source).read_text()))
        (RESULTS / "data").mkdir(parents=True, exist_ok=True)
        (RESULTS / "data" / f"{name}.json").write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    for path in write_pages(args.out):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
