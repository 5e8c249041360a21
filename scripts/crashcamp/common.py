"""What every part of the campaign shares: where the repository and the
entry script are, the client names, the -v progress log and log tails."""

import os
import time

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
# scripts/crash_campaign.py: the entry point, which the campaign re-invokes
# for its helper processes.
SCRIPT = os.path.join(os.path.dirname(PACKAGE_DIR), "crash_campaign.py")
REPO = os.path.dirname(os.path.dirname(PACKAGE_DIR))
CLIENTS = ("postgres", "sqlite-rollback", "sqlite-wal")
VERBOSE = False


def set_verbose(on):
    global VERBOSE
    VERBOSE = on


def log(msg):
    if VERBOSE:
        print(f"  [{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def tail(path, lines=15):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return ""
    text = data.decode("utf-8", "replace").rstrip("\n").split("\n")
    return "\n".join(text[-lines:])
