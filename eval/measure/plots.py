"""Figures and the Markdown report: PNGs from eval summaries and `bench.json`, one comparison table.

Last step of the flow, after `eval/measure/evaluate.py` (per-drafter `summary.json`: τ, acceptance by
depth, per-category τ, speedup vs HF generate) and `eval/measure/bench.py` (`bench.json`: speedup by batch
size and temperature). It only draws what those measured. matplotlib runs on the Agg backend, so
no display is needed.

    acceptance_by_depth.png   n-α per depth, one line per drafter
    tau_by_category.png       τ per prompt category, one bar group per category
    speedup_vs_batch.png      speedup over our plain batched loop vs batch size, one line per
                              (drafter, temperature); fallen-back points drawn hollow
    report.md                 links to the PNGs + one table (τ, α@1..4, tok/s, speedup vs HF generate)
"""

from __future__ import annotations

from pathlib import Path

from draftsmith.eval.measure.report import fmt


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    fig.clf()
    _pyplot().close(fig)
    return path


def plot_acceptance(rows: list[dict], path: str | Path) -> Path:
    """`rows`: dicts with `drafter` and `acceptance_by_depth` (eval summaries or bench configurations)."""
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6, 4))
    for row in rows:
        alphas = row.get("acceptance_by_depth") or []
        if alphas:
            ax.plot(range(1, len(alphas) + 1), alphas, marker="o", label=row.get("title") or row["drafter"])
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="draft depth d", ylabel="P(accept d | 1..d-1 accepted)", ylim=(0, 1.05),
           title="acceptance by depth (n-α)")
    if ax.lines:
        ax.legend(fontsize="small")
    return _save(fig, Path(path))


def plot_tau_by_category(rows: list[dict], path: str | Path) -> Path:
    """`rows`: dicts with `drafter` and `by_category` ({category: {"tau": ...}}), e.g. eval summaries."""
    plt = _pyplot()
    categories = sorted({c for row in rows for c in row.get("by_category", {})})
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(categories)), 4))
    width = 0.8 / max(len(rows), 1)
    for i, row in enumerate(rows):
        taus = [row.get("by_category", {}).get(c, {}).get("tau", 0.0) for c in categories]
        ax.bar([x + i * width for x in range(len(categories))], taus, width,
               label=row.get("title") or row["drafter"])
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xticks([x + width * (len(rows) - 1) / 2 for x in range(len(categories))], categories, rotation=20)
    ax.set(ylabel="τ (tokens per target forward)", title="τ by category")
    if rows:
        ax.legend(fontsize="small")
    return _save(fig, Path(path))


def plot_speedup_vs_batch(configs: list[dict], path: str | Path) -> Path:
    """`configs`: bench configurations; one line per (drafter, temperature), speedup over our plain loop."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    lines: dict[tuple[str, float], list[dict]] = {}
    for c in configs:
        lines.setdefault((c["drafter"], c["temperature"]), []).append(c)
    for (drafter, temperature), points in sorted(lines.items()):
        points = sorted(points, key=lambda c: c["batch_size"])
        (line,) = ax.plot([c["batch_size"] for c in points], [c["speedup"] or 0 for c in points],
                          label=f"{points[0].get('title') or drafter} T={temperature:g}")
        for c in points:
            ax.plot(c["batch_size"], c["speedup"] or 0, "o", color=line.get_color(),
                    markerfacecolor="none" if c["fell_back"] else line.get_color())
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    sizes = sorted({c["batch_size"] for c in configs})
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.minorticks_off()
    ax.set(xlabel="batch size", ylabel="speedup vs plain batched decoding",
           title="speedup vs batch size (hollow: fell back to plain)")
    if lines:
        ax.legend(fontsize="small")
    return _save(fig, Path(path))


def bench_rows(bench: dict) -> list[dict]:
    """Per drafter, its speculative configuration at the lowest (temperature, batch size): acceptance and τ
    by category barely depend on the batch. Where every configuration fell back, the calibration's
    acceptance stands in and τ by category is left out (plain decoding ran, its τ is 1 by definition)."""
    best: dict[str, dict] = {}
    for c in sorted(bench.get("configs", []),
                    key=lambda c: (c["fell_back"], c["temperature"], c["batch_size"])):
        if c["drafter"] not in best:
            if c["fell_back"]:
                calibration = c.get("calibration") or {}
                best[c["drafter"]] = dict(c, tau=calibration.get("tau", c["tau"]), by_category={},
                                          acceptance_by_depth=calibration.get("acceptance_by_depth", []))
            else:
                best[c["drafter"]] = dict(c, by_category=c.get("by_category", {}))
    return list(best.values())


def write_bench_plots(bench: dict, out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = bench_rows(bench)
    return [plot_acceptance(rows, out / "acceptance_by_depth.png"),
            plot_tau_by_category([r for r in rows if r["by_category"]], out / "tau_by_category.png"),
            plot_speedup_vs_batch(bench.get("configs", []), out / "speedup_vs_batch.png")]


def _drafter_key(name: str) -> str:
    """One drafter however it was named: a kind as is, a folder by its resolved path (relative or
    absolute)."""
    return str(Path(name).resolve()) if Path(name).exists() else name


def _bench_speedups(bench: dict | None, drafter: str, planned: bool = False) -> str:
    """`drafter`: an eval summary's `drafter_path` (`drafter.path or drafter.kind`), as bench records it too;
    `planned`: whether that eval served the folder's plan (a bench configuration counts only for the same)."""
    key = _drafter_key(drafter)
    configs = [c for c in (bench or {}).get("configs", [])
               if (drafter == c["drafter"] or key == _drafter_key(c.get("drafter_path", "")))
               and bool(c.get("served_by_plan")) == planned]
    return ", ".join(f"b{c['batch_size']} T{c['temperature']:g} "
                     f"×{fmt(c['speedup'])}{' (fb)' if c['fell_back'] else ''}"
                     for c in sorted(configs, key=lambda c: (c["temperature"], c["batch_size"]))) or "–"


def write_report(summaries: list[dict], bench: dict | None, out_dir: str | Path) -> Path:
    """`report.md` in `out_dir` with its PNGs: eval summaries (one row each) and, when given, bench.json.

    Table: drafter, τ, α at depth 1-4, tokens/s, speedup vs HF generate (batch 1, eval), and the
    bench's speedups over our plain batched loop per batch size (fb = fell back to plain).
    Drafters only in the bench get rows from their lowest (temperature, batch) configuration.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = list(summaries)
    named = {_drafter_key(s.get("drafter_path", s["drafter"])) for s in rows}
    rows += [r for r in bench_rows(bench or {}) if _drafter_key(r.get("drafter_path",
                                                                      r["drafter"])) not in named]
    pngs = [plot_acceptance(rows, out / "acceptance_by_depth.png"),
            plot_tau_by_category([r for r in rows if r.get("by_category")], out / "tau_by_category.png")]
    if bench and bench.get("configs"):
        pngs.append(plot_speedup_vs_batch(bench["configs"], out / "speedup_vs_batch.png"))
    header = ["drafter", "τ", "α@1", "α@2", "α@3", "α@4", "tok/s", "speedup vs HF generate", "bench ×plain"]
    lines = ["# draftsmith report", "", *[f"![{p.stem}]({p.name})" for p in pngs], "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        alphas = list(r.get("acceptance_by_depth") or [])[:4]
        alphas += [None] * (4 - len(alphas))
        cells = [r.get("title") or r["drafter"], fmt(r.get("tau")), *[fmt(a) for a in alphas],
                 fmt(r.get("tokens_per_s"), 1), fmt(r.get("speedup_vs_hf")),
                 _bench_speedups(bench, r.get("drafter_path", r["drafter"]), bool(r.get("served_by_plan")))]
        lines.append("| " + " | ".join(cells) + " |")
    if bench and bench.get("machine"):
        lines += ["", f"Machine: {bench['machine'].get('device')}, torch {bench['machine'].get('torch')}."]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
