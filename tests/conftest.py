"""The zoo of model factories lives in benchmarks/ (shared with benchmarks/zoo.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
