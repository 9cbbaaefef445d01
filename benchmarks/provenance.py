"""The commit a benchmark result was measured on, for the results files: a figure
is only comparable with another of the same code."""

from __future__ import annotations

import subprocess
from pathlib import Path


def commit(root: Path) -> dict:
    """{"commit": short hash or None, "commit_dirty": tracked files changed (None: no git)}."""
    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                                  check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None

    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": git("rev-parse", "--short", "HEAD"),
            "commit_dirty": bool(dirty) if dirty is not None else None}
