"""The committed Python bindings are what schemas/remat_ir.proto compiles to."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "schemas"))
import generate  # noqa: E402


def test_generated_code_is_current():
    result = subprocess.run([sys.executable, str(ROOT / "schemas" / "generate.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_stale_code_is_detected(tmp_path, monkeypatch):
    for name in generate.GENERATED:
        shutil.copy(ROOT / "ir" / name, tmp_path / name)
    monkeypatch.setattr(generate, "TARGET", tmp_path)
    assert generate.stale_files() == []
    stale = tmp_path / "remat_ir_pb2.py"
    stale.write_text(stale.read_text().replace("remat_ir.proto", "old.proto"))
    assert generate.stale_files() == ["remat_ir_pb2.py"]


@pytest.mark.parametrize("module", ["remat_ir.ir", "remat_ir.solvers", "remat_ir.cli"])
def test_layers_import_without_torch(module):
    """The IR, solver and CLI layers never pull in torch (docs/architecture.md, "Layers")."""
    code = f"import sys, {module}; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
