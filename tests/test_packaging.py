"""`pip install .` gives the same importable package as the editable install the tests use."""

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_holds_every_module_of_the_source_layout(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info",
                                                             "__pycache__", ".pytest_cache",
                                                             ".hypothesis"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "dist"), str(src)], check=True)
    (wheel,) = (tmp_path / "dist").glob("remat_ir-*.whl")
    in_wheel = {n for n in zipfile.ZipFile(wheel).namelist() if n.endswith((".py", ".pyi"))}

    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    from_source = {package.replace(".", "/") + "/" + f.name
                   for package, folder in mapping.items()
                   for f in (ROOT / folder).iterdir() if f.suffix in (".py", ".pyi")}
    assert in_wheel == from_source

    # Installed from the wheel (not the source tree), the command works the same way.
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                    str(wheel)], check=True)
    env = dict(os.environ, PYTHONPATH=str(site))
    result = subprocess.run([sys.executable, "-m", "remat_ir", "validate", str(ROOT / "examples" / "mlp.rir")],
                            capture_output=True, text=True, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    where = subprocess.run([sys.executable, "-c", "import remat_ir.ir; print(remat_ir.ir.__file__)"],
                           capture_output=True, text=True, cwd=tmp_path, env=env).stdout
    assert where.startswith(str(site))
