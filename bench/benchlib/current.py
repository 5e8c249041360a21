"""The current summary at the top of docs/benchmarks.md: one table of the
newest figures per workload, rebuilt from the raw results in bench/results
so that it needs no benchmark run (`python3 bench/run.py report`)."""

import json
import os
import re
import sys

from . import report

START, END = "<!-- current-summary:start -->", "<!-- current-summary:end -->"

# The reference filesystems in the order the columns take; others that turn
# up in a result follow by name.
REFS = ("btrfs", "xfs", "ext4", "fuse2fs", "tmpfs", "passthrough_hp")
# Every ratio in the table is against this one filesystem, as the issues'
# aims are written.
BASE = "btrfs"
# A run counts as a median only with this many rounds on a workload; fewer
# is a single time.
MIN_ROUNDS = 2
SAMPLE_KEYS = ("workload", "fs", "round", "metric", "value", "unit", "better")
STEM = re.compile(r"^(\d{4}-\d{2}-\d{2})(?:-(\d+))?(?:-(.+))?$")


def warn(msg):
    print(f"run.py report: {msg}", file=sys.stderr)


def is_variant(fs):
    """Canopy under another build or options (canopy-old, canopy-zstd,
    ...): an experiment for the history, not a column of the summary,
    whose 'canopy' is the default mount at the run's commit."""
    return fs.startswith("canopy-")


def run_order(stem):
    """The key that sorts runs oldest first, or None without a date.
    run.py numbers a day's runs <date>, <date>-2, ...; runs renamed by hand
    (<date>-<name>) record no time, so they go by name after the day's
    numbered ones."""
    m = STEM.match(stem)
    if not m:
        return None
    date, n, name = m.groups()
    return (date, 1 if name else 0, int(n or 1), name or "")


def read_samples(path):
    """The samples of a .jsonl file, or None (with a warning) if any line is
    not a sample: a damaged file says nothing reliable about its run."""
    samples = []
    try:
        with open(path) as f:
            for no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                s = json.loads(line)
                if not isinstance(s, dict) or any(k not in s for k in SAMPLE_KEYS) \
                        or not isinstance(s["value"], (int, float)) \
                        or isinstance(s["value"], bool):
                    raise ValueError(f"line {no} is not a sample")
                samples.append(s)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        warn(f"skipping {os.path.basename(path)}: {e}")
        return None
    if not samples:
        warn(f"skipping {os.path.basename(path)}: no samples")
    return samples


def read_commit(md_path):
    """Canopy's commit from the run's report ('- canopy: <hash>'), '' if
    it records none. A hash followed by words (a run of uncommitted changes
    on top of it, written in by hand) gets a '+'."""
    try:
        with open(md_path) as f:
            for line in f:
                if line.startswith("- canopy:"):
                    words = line.split(":", 1)[1].split()
                    if words and re.fullmatch(r"[0-9a-f]{7,40}", words[0]):
                        return words[0] + ("+" if len(words) > 1 else "")
                    return ""
    except (OSError, UnicodeDecodeError):
        pass
    return ""


def load_runs(results_dir):
    """Every complete run in results_dir, oldest first, as dicts with stem,
    order, commit, samples and summary (report.summarize's shape). A .jsonl
    without its .md is skipped: run.py writes the report last, so that run
    was aborted or is still going."""
    runs = []
    for name in sorted(os.listdir(results_dir)):
        stem, ext = os.path.splitext(name)
        if ext != ".jsonl":
            if ext == ".json":
                warn(f"skipping {name}: not run.py's .jsonl samples")
            continue
        order = run_order(stem)
        md = os.path.join(results_dir, stem + ".md")
        if order is None:
            warn(f"skipping {name}: no date in its name")
            continue
        if not os.path.exists(md):
            warn(f"skipping {name}: no {stem}.md (an aborted or unfinished run)")
            continue
        samples = read_samples(os.path.join(results_dir, name))
        if not samples:
            continue
        fss = []
        for s in samples:
            if s["fs"] not in fss:
                fss.append(s["fs"])
        runs.append({"stem": stem, "order": order, "commit": read_commit(md),
                     "samples": samples, "summary": report.summarize(samples, fss)})
    runs.sort(key=lambda r: r["order"])
    return runs


def rounds(run, workload, fs):
    return len({s["round"] for s in run["samples"]
                if s["workload"] == workload and s["fs"] == fs})


def pick(runs, workload):
    """The run the summary takes a workload from: the newest that measured
    Canopy and btrfs on it in at least MIN_ROUNDS rounds each (a ratio from
    one run's medians), else the newest that measured Canopy at all."""
    measured = [r for r in runs if rounds(r, workload, "canopy")]
    full = [r for r in measured
            if min(rounds(r, workload, "canopy"), rounds(r, workload, BASE)) >= MIN_ROUNDS]
    return (full or measured or [None])[-1]


def scale_text(scale):
    if scale and float(1 / scale).is_integer() and scale < 1:
        return f"1/{int(1 / scale)}"
    return f"{scale:g}"


def run_cell(run, workload, link):
    """Where a workload's figures come from: the run (its date is its
    name) linked through `link` (results as seen from the docs), Canopy's
    commit, scale and rounds."""
    stem = run["stem"]
    parts = [f"[{stem}]({link}/{stem}.md)"]
    if run["commit"]:
        parts.append(run["commit"])
    scales = sorted({s["scale"] for s in run["samples"]
                     if s["workload"] == workload and isinstance(s.get("scale"), (int, float))})
    if scales:
        parts.append("scale " + ", ".join(scale_text(x) for x in scales))
    n = rounds(run, workload, "canopy")
    parts.append(f"{n} round{'s' if n != 1 else ''}")
    return ", ".join(parts)


def metric_text(metric, unit):
    """The metric's name, which carries its unit; the unit is added where
    the name lacks it."""
    if unit and f"({unit})" not in metric:
        return f"{metric} ({unit})"
    return metric


def speed_ratio(better, canopy, ref):
    """report.ratio, but '-' unless both medians are above zero: a ratio
    of signed figures (qgroups' change in used bytes) reads as nonsense."""
    if canopy is None or ref is None or canopy <= 0 or ref <= 0:
        return "-"
    return report.ratio(better, canopy, ref)


def columns(picked):
    """Canopy, then the reference filesystems any picked run measured."""
    seen = set()
    for w, run in picked:
        for _, _, stats in run["summary"][w]:
            seen |= {f for f in stats if f != "canopy" and not is_variant(f)}
    return ["canopy"] + [f for f in REFS if f in seen] + sorted(seen - set(REFS))


def table(picked, link):
    """One row per metric; the workload and its run are named on the first
    row of each workload."""
    fss = columns(picked)
    head = ["workload", "run", "metric"] + fss + [f"canopy vs {BASE} (speed)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w, run in picked:
        first = True
        for metric, better, stats in run["summary"][w]:
            unit = next((s["unit"] for s in run["samples"]
                         if s["workload"] == w and s["metric"] == metric), "")
            cells = [w, run_cell(run, w, link)] if first else ["", ""]
            cells.append(metric_text(metric, unit))
            cells += [report.fmt(stats[f][0]) if f in stats else "" for f in fss]
            cells.append(speed_ratio(better, stats.get("canopy", (None,))[0],
                                     stats.get(BASE, (None,))[0]))
            lines.append("| " + " | ".join(cells) + " |")
            first = False
    return lines


def section(picked, link):
    """The text between the markers: heading, how it is made, the table."""
    body = [START, "", "## Current figures", "",
            "Regenerated from the raw samples in `bench/results/` by",
            "`python3 bench/run.py report` (which measures nothing) and by every",
            "run of `bench/run.py` that writes the docs; edits between the",
            "markers are lost. For each workload, the newest run that measured",
            f"Canopy and {BASE} in at least {MIN_ROUNDS} rounds (else the newest that",
            "measured Canopy): medians of its rounds, in the unit the metric's",
            "name gives; blank where that run did not measure a filesystem. The",
            f"ratio, from that run alone, is speed: Canopy's rate over {BASE}'s, or",
            f"{BASE}'s time (or other figure where less is better) over Canopy's;",
            "above 1x Canopy is ahead, `-` where no ratio holds (counts, values at",
            f"or below zero, no {BASE}). Canopy variants (canopy-old, canopy-zstd,",
            "...), other scripts' figures and runs not kept in `bench/results/`",
            "are only in the history below.", ""]
    if any(run["commit"].endswith("+") for _, run in picked):
        body += ["A `+` after a commit: that run measured uncommitted changes on it.", ""]
    if picked:
        body += table(picked, link)
    else:
        body.append("No results in `bench/results/` yet.")
    body += ["", END]
    return "\n".join(body)


def insert_point(text):
    """Just after the title and the paragraph under it, where a reader
    starts."""
    lines = text.split("\n")
    i = next((n for n, l in enumerate(lines) if l.startswith("# ")), -1) + 1
    while i < len(lines) and not lines[i].strip():
        i += 1
    while i < len(lines) and lines[i].strip():
        i += 1
    return len("\n".join(lines[:i]))


def update_docs(docs_path, results_dir, order=()):
    """Rewrites the current summary in docs_path from results_dir, leaving
    every byte outside the markers as it was. `order`: workload names in
    the order the rows take (others follow by name). Returns the number
    of workloads in the table."""
    runs = load_runs(results_dir)
    names = {w for r in runs for w in r["summary"]}
    ordered = [w for w in order if w in names] + sorted(names - set(order))
    picked = [(w, run) for w in ordered for run in [pick(runs, w)] if run]
    link = os.path.relpath(results_dir, os.path.dirname(os.path.abspath(docs_path)))
    new = section(picked, link.replace(os.sep, "/"))
    with open(docs_path) as f:
        text = f.read()
    if START in text and END in text:
        text = text[: text.index(START)] + new + text[text.index(END) + len(END):]
    else:
        at = insert_point(text)
        text = text[:at] + "\n\n" + new + text[at:]
    with open(docs_path, "w") as f:
        f.write(text)
    return len(picked)
