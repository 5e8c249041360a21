"""What the campaign prints and writes: one line per round (with its
reasons, notes and kept image), the summary by client, size and fill, and
the --json summary."""

import json


def round_line(r):
    status = "PASS" if r["passed"] else "FAIL"
    missing = "-" if r["missing"] is None else str(r["missing"])
    kill = "+".join(f"{k:.1f}" for k in r["kills"]) + "s" if r["kills"] else "-"
    sc = lambda rc: "-" if rc is None else str(rc)  # noqa: E731
    return (f"{r['client']:<15} {r['size']:>5} fill={r['fill']:<4g} r{r['round']:<3} "
            f"kill@{kill:<6} acked={r['acked']:<6} missing={missing:<5} "
            f"integrity={'-' if r['integrity'] is None else ('ok' if r['integrity'] == 'ok' else 'BAD')} "
            f"scrub={sc(r['scrub_rc'])} check={sc(r['check_rc'])} "
            f"{r['seconds']:5.1f}s  {status}")


def print_round(r, verbose):
    print(round_line(r), flush=True)
    for why in r["reasons"]:
        print(f"    - {why}", flush=True)
    if verbose:
        for note in r["notes"]:
            print(f"    note: {note}", flush=True)
        for line in r.get("pg_redo", []):
            print(f"    postgres: {line}", flush=True)
    if r["kept"]:
        print(f"    kept: {r['kept']}", flush=True)


def failure_kinds(rs):
    """What went wrong in a group of rounds, in words."""
    kinds = []
    if any(r["daemon_died"] for r in rs):
        kinds.append("daemon died by itself")
    if any(r["mount_error"] for r in rs):
        kinds.append(f"{sum(bool(r['mount_error']) for r in rs)} mount failures")
    if any(r["missing"] for r in rs):
        kinds.append(f"{sum(r['missing'] or 0 for r in rs)} missing ids")
    if any(r["integrity"] not in (None, "ok") for r in rs):
        kinds.append("integrity errors")
    if any(r["scrub_rc"] == 3 for r in rs):
        kinds.append("scrub damage")
    if any(r["scrub_rc"] not in (0, 3) for r in rs):
        kinds.append("scrub could not run")
    if any(r["check_rc"] == 4 for r in rs):
        kinds.append("check problems")
    if any(r["check_rc"] not in (0, 4) for r in rs):
        kinds.append("check could not check")
    return kinds


def print_summary(results, seconds, seed, keep_passing):
    """Prints the summary; returns (rounds passed, rounds failed)."""
    passed = sum(r["passed"] for r in results)
    failed = len(results) - passed
    print(f"\nsummary: {len(results)} rounds, {passed} passed, {failed} failed "
          f"in {seconds:.0f} s (seed {seed})")
    groups = {}
    for r in results:
        groups.setdefault((r["client"], r["size"], r["fill"]), []).append(r)
    for (c, s, f), rs in groups.items():
        nf = sum(not r["passed"] for r in rs)
        kinds = failure_kinds(rs)
        print(f"  {c:<15} {s:>5} fill={f:<4g}: {len(rs) - nf}/{len(rs)} passed"
              + (f" ({', '.join(kinds)})" if kinds else ""))
    kept = [r["kept"] for r in results if r["kept"]]
    if kept:
        print("images kept (failing rounds" + (", and passing ones" if keep_passing else "")
              + "; logs next to them):")
        for k in kept:
            print(f"  {k}")
    return passed, failed


def write_json(path, seed, args, results, passed, failed, interrupted):
    with open(path, "w") as f:
        json.dump({"seed": seed, "canopy": args.canopy, "canopy_sha256": args.canopy_sha,
                   "mount_opts": args.mount_opts,
                   "power_cut": args.power_cut and {"loss": args.power_cut, "at": args.cut_at,
                                                    "sector": args.sector,
                                                    "barriers": args.barriers},
                   "rounds": results,
                   "passed": passed, "failed": failed, "interrupted": interrupted},
                  f, indent=2)
