"""Tables and plots from the samples of a run."""

import os
import statistics


def summarize(samples, filesystems):
    """samples: list of dicts (workload, fs, round, metric, value, unit,
    better). Returns {workload: [(metric, better, {fs: (median, lo, hi)})]}
    in first-seen order."""
    out = {}
    for s in samples:
        rows = out.setdefault(s["workload"], {})
        row = rows.setdefault(s["metric"], {"better": s["better"], "values": {}})
        row["values"].setdefault(s["fs"], []).append(s["value"])
    result = {}
    for w, rows in out.items():
        result[w] = []
        for metric, row in rows.items():
            stats = {f: (statistics.median(v), min(v), max(v))
                     for f, v in row["values"].items() if f in filesystems}
            result[w].append((metric, row["better"], stats))
    return result


def ratio(better, canopy, ref):
    """Canopy's standing against a reference, as 'N.NNx' where more is
    better for Canopy."""
    if canopy is None or ref is None or better == "info":
        return "-"
    if better == "higher":
        return f"{canopy / ref:.2f}x" if ref else "-"
    return f"{ref / canopy:.2f}x" if canopy else "-"


# Filesystems that bound what Canopy can reach rather than rival it: the
# tables give Canopy's time as a multiple of theirs, the way issue 54's
# aims are written (e.g. <= 1.25x passthrough_hp's time).
CEILINGS = ("passthrough_hp",)


def time_ratio(better, canopy, ref):
    """Canopy's time (or other cost: memory) as a multiple of a ceiling's,
    as 'N.NNx' where less is better for Canopy: the inverse of ratio()."""
    if canopy is None or ref is None or better == "info":
        return "-"
    if better == "lower":
        return f"{canopy / ref:.2f}x" if ref else "-"
    return f"{ref / canopy:.2f}x" if canopy else "-"


def ratio_column(ref):
    """The header and the function of the column comparing Canopy with
    `ref`."""
    if ref in CEILINGS:
        return f"canopy time vs {ref}", time_ratio
    return f"canopy vs {ref}", ratio


def fmt(v):
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


def table(rows, filesystems):
    refs = [f for f in filesystems if f != "canopy"]
    head = ["metric"] + filesystems + [ratio_column(r)[0] for r in refs
                                       if "canopy" in filesystems]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for metric, better, stats in rows:
        cells = [metric]
        for f in filesystems:
            if f in stats:
                med, lo, hi = stats[f]
                cells.append(f"{fmt(med)} ({fmt(lo)}–{fmt(hi)})" if lo != hi else fmt(med))
            else:
                cells.append("n/a")
        if "canopy" in filesystems:
            c = stats.get("canopy", (None,))[0]
            for r in refs:
                cells.append(ratio_column(r)[1](better, c, stats.get(r, (None,))[0]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(workload, rows, filesystems, path):
    """A bar chart per metric of the workload; returns False without
    matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in rows if r[1] != "info"]
    if not rows:
        return False
    cols = min(3, len(rows))
    nrows = (len(rows) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.2 * nrows), squeeze=False)
    for ax in axes.flat[len(rows):]:
        ax.axis("off")
    for ax, (metric, better, stats) in zip(axes.flat, rows):
        names = [f for f in filesystems if f in stats]
        meds = [stats[f][0] for f in names]
        errs = [[stats[f][0] - stats[f][1] for f in names], [stats[f][2] - stats[f][0] for f in names]]
        colors = ["tab:green" if f == "canopy" else "tab:gray" for f in names]
        ax.bar(names, meds, yerr=errs, color=colors, capsize=3)
        ax.set_title(f"{metric}\n({better} is better)", fontsize=9)
        ax.tick_params(axis="x", labelsize=8, rotation=30)
    fig.suptitle(f"{workload}: median and min–max")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def write_report(path, plots_dir, summary, filesystems, meta):
    os.makedirs(plots_dir, exist_ok=True)
    parts = [f"# Canopy benchmarks, {meta['date']}", "",
             f"Command: `{meta['command']}`", "",
             "## Machine", ""]
    parts += [f"- {k}: {v}" for k, v in meta["machine"].items()]
    parts += ["", "Each filesystem ran on its own sparse image file of the same size on the",
              "same disk (kernel filesystems loop-mounted), alternately, "
              f"{meta['rounds']} round(s); medians with min–max. Ratios: more than 1x",
              "means Canopy is better (faster, or more throughput).",
              "'CPU stolen by the host' is the share of the machine's CPU time during",
              "each round that the hypervisor gave to other guests: on a shared host it",
              "swings from none to two fifths, and a round that lost much is slow for the",
              "host's reasons, not the filesystem's."]
    if any(f in CEILINGS for f in filesystems):
        parts += ["'canopy time vs passthrough_hp' is the other way round: Canopy's time",
                  "(for a rate, the time of the same work; for MiB, its memory) as a",
                  "multiple of passthrough_hp's, libfuse's example over ext4 (the FUSE",
                  "ceiling); less is better, 1x is the ceiling."]
    parts += [""]
    for w, rows in summary.items():
        fss = [f for f in filesystems if any(f in r[2] for r in rows)]
        parts += [f"## {w}", "", meta["docs"].get(w, ""), "", table(rows, fss), ""]
        png = os.path.join(plots_dir, f"{w}.png")
        if plot(w, rows, fss, png):
            parts += [f"![{w}]({os.path.relpath(png, os.path.dirname(path))})", ""]
    with open(path, "w") as f:
        f.write("\n".join(parts))


def update_docs_summary(docs_path, summary, filesystems, report_rel, date):
    """Replaces the generated section of docs/benchmarks.md."""
    start, end = "<!-- bench-summary:start -->", "<!-- bench-summary:end -->"
    with open(docs_path) as f:
        text = f.read()
    body = [start, "", f"Latest run: {date}, full report `{report_rel}`.", ""]
    for w, rows in summary.items():
        fss = [f for f in filesystems if any(f in r[2] for r in rows)]
        body += [f"### {w}", "", table(rows, fss), ""]
    body.append(end)
    new = "\n".join(body)
    if start in text and end in text:
        text = text[: text.index(start)] + new + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n## Seed workloads (issue #5)\n\n" + new + "\n"
    with open(docs_path, "w") as f:
        f.write(text)
