"""Ctrl-C during training on a page: docs/results/interrupts.md from interrupt_trials.py's JSON."""

from __future__ import annotations

from draftsmith.eval.measure.campaign import Page, num, table

INTERRUPT_CHECKS = [("stopped_with_checkpoint", "stopped with a checkpoint"),
                    ("lost_nothing", "lost nothing"), ("checkpoints_kept", "checkpoints kept"),
                    ("metrics_continuous", "metrics continuous"), ("weights_equal", "weights equal"),
                    ("eval_written", "eval written")]


def render_interrupts(data: dict) -> list[str]:
    lines = [f"A tiny target (2-layer, 32-wide Llama), Medusa, {data['steps']} steps, a checkpoint every "
             f"{data['save_every']} steps, the newest {data['keep_checkpoints']} kept, seed {data['seed']}. "
             "Each trial sends a real SIGINT at a random step, then reruns the same command (plain, or with "
             "`--resume`) to the end and compares it with an uninterrupted run. Columns count the trials "
             "where each check holds (`scripts/bench/interrupts/interrupt_trials.py` defines them).", ""]
    cells = data["cells"]
    lines += table(["command / rerun", "trials", *(label for _, label in INTERRUPT_CHECKS), "max steps lost",
                    "seconds"],
                   [[f"`{name}`", c["trials"], *(c.get(key) for key, _ in INTERRUPT_CHECKS),
                     c["lost_steps_max"], num(c["seconds"], 1)] for name, c in cells.items()])
    lines += ["## Per trial", ""]
    rows = []
    for name, c in cells.items():
        details = c.get("details") or []
        rows.append([f"`{name}`", ", ".join(str(d["interrupt_at"]) for d in details),
                     ", ".join(str(d.get("resumed_from")) for d in details),
                     ", ".join(sorted({str(d["stop_rc"]) for d in details}))])
    lines += table(["command / rerun", "SIGINT after step", "rerun resumed from",
                    "exit status of the stopped run"], rows)
    example = next((d["stop_line"] for c in cells.values() for d in c.get("details") or []
                    if d.get("stop_line")), None)
    if example:
        lines += ["What a stopped run printed (first trial):", "", "```text", example, "```", ""]
    return lines


def slim_interrupts(data: dict) -> dict:
    """The committed copy keeps every figure; the printed stop line only for each cell's first trial (the
    others repeat it with another step number)."""
    for cell in data["cells"].values():
        for d in (cell.get("details") or [])[1:]:
            d.pop("stop_line", None)
    data.setdefault("notes", []).append("stop_line kept for the first trial of each cell only "
                                        "(results_pages.py --add interrupts)")
    return data


PAGES = {  # docs/results/<name>.md from docs/results/data/<name>.json (scripts/bench/results_pages.py)
    "interrupts": Page(
        title="Ctrl-C during training: what survives",
        summary="SIGINT at a random step of train and pipeline, then a rerun: steps lost, checkpoints, "
                "weights",
        command="`python scripts/bench/interrupts/interrupt_trials.py OUT.json --trials 20`",
        render=render_interrupts, slim=slim_interrupts),
}
