"""The layers import only along the flow: ir <- solvers; ir <- torchlib <- frontends, runtimes; facade.

Each layer promises something that an import against the flow would quietly
break: `ir` (the IR, files, simulator) and the solvers run without torch, so
a schedule can be planned on a machine without it; frontends and runtimes
share torch's types through one package (`remat_ir.torchlib`) and never
import each other, so either can change without the other; only the facade
(the `remat_ir/*.py` modules: `remat`, the command) wires the layers together,
and no layer depends on it.

The check is an AST walk over the package's source files rather than
import-linter: the repository's folders install under other names
(`ir/` is `remat_ir.ir`, read from pyproject's [tool.setuptools.package-dir]),
which a walk maps directly, with no extra dependency and no install, and the
same function can be pointed at a throwaway tree to prove that it catches an
injected violation. Every import statement counts, also one inside a function
or under `if TYPE_CHECKING:`; relative imports are resolved against the
installed names.
"""

from __future__ import annotations

import ast
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOP = "remat_ir"
FACADE = "facade"
#: The package that frontends and runtimes share for torch's types and op resolution.
TORCH_TYPES = "torchlib"
#: External top-level packages that only the torch-facing layers may import.
TORCH = {"torch"}

#: What each layer may import: other layers of remat_ir by name, and "torch".
#: A layer always may import itself; the facade may import anything.
ALLOWED = {
    "ir": set(),
    "solvers": {"ir"},
    TORCH_TYPES: {"ir", "torch"},
    "frontends": {"ir", TORCH_TYPES, "torch"},
    "runtimes": {"ir", TORCH_TYPES, "torch"},
}

#: Edges that break the rules and are tolerated for now: none. Each would be (importing
#: file, imported module); the test fails when one is no longer there, so that nothing
#: new can hide behind an entry.
KNOWN_VIOLATIONS: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Violation:
    path: str      # relative to the checked root
    line: int
    layer: str     # of the importing file
    imported: str  # the module named by the import
    target: str    # its layer, or "torch"

    def __str__(self) -> str:
        allowed = sorted(ALLOWED.get(self.layer, ()))
        return (f"{self.path}:{self.line}: {self.layer} imports {self.imported} ({self.target}); "
                f"{self.layer} may import only " + (", ".join(allowed) if allowed else "itself"))


def package_dirs(root: Path) -> dict[str, Path]:
    """Installed package name -> its folder: remat_ir and each `remat_ir.X` that pyproject's
    [tool.setuptools] maps in `package-dir` or lists in `packages` (unmapped: remat_ir/X)."""
    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping = setuptools.get("package-dir", {})
    folders = {name: (root / folder).resolve() for name, folder in mapping.items()
               if name == TOP or name.startswith(TOP + ".")}
    folders.setdefault(TOP, (root / TOP).resolve())
    for name in setuptools.get("packages", []):
        if name.count(".") == 1 and name.startswith(TOP + "."):
            folders.setdefault(name, folders[TOP] / name.split(".")[1])
    return folders


def layer_of(module: str, packages: dict[str, Path]) -> str | None:
    """`remat_ir.solvers.rotor` -> "solvers"; modules of `remat_ir` itself -> the facade;
    None outside remat_ir. A layer is a package that pyproject maps to a folder of its own."""
    if module != TOP and not module.startswith(TOP + "."):
        return None
    for name in sorted(packages, key=len, reverse=True):
        if name != TOP and (module == name or module.startswith(name + ".")):
            return name.split(".")[1]
    return FACADE


def source_files(packages: dict[str, Path]) -> dict[Path, str]:
    """Every .py file of the package -> its installed module name. A file belongs to the
    deepest mapped folder that holds it (a layer's folder may sit inside remat_ir/)."""
    folders = sorted(packages.items(), key=lambda item: len(item[1].parts), reverse=True)
    files = {}
    for _, folder in folders:
        for path in folder.rglob("*.py"):
            if "__pycache__" in path.parts or path in files:
                continue
            name, base = next((n, f) for n, f in folders if path.is_relative_to(f))
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            files[path] = ".".join([name, *parts])
    return files


def imported_modules(tree: ast.AST, module: str, is_package: bool, known: set[str]):
    """(line, module) for every import in `tree`, relative ones resolved. `from P import x`
    names P.x when that is a module of ours (`from remat_ir import ir` imports the IR layer),
    otherwise P."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module
            for alias in node.names:
                candidate = f"{source}.{alias.name}"
                yield node.lineno, candidate if candidate in known or any(
                    k.startswith(candidate + ".") for k in known) else source


def violations(root: Path) -> list[Violation]:
    """Every import in the package under `root` that goes against the flow."""
    packages = package_dirs(root)
    files = source_files(packages)
    known = set(files.values()) | set(packages)
    found = []
    for path, module in sorted(files.items()):
        layer = layer_of(module, packages)
        if layer == FACADE:
            continue
        if layer not in ALLOWED:
            raise AssertionError(f"{path.relative_to(root)}: pyproject maps a package {layer!r} that "
                                 f"this test has no rule for; add it to ALLOWED")
        tree = ast.parse(path.read_text(), filename=str(path))
        for line, imported in sorted(set(imported_modules(tree, module, path.name == "__init__.py", known))):
            target = "torch" if imported.split(".")[0] in TORCH else layer_of(imported, packages)
            if target is None or target == layer or target in ALLOWED[layer]:
                continue
            found.append(Violation(path.relative_to(root).as_posix(), line, layer, imported, target))
    return found


def test_imports_follow_the_layers():
    found = violations(ROOT)
    new = [v for v in found if (v.path, v.imported) not in KNOWN_VIOLATIONS]
    assert not new, "imports against the layers:\n" + "\n".join(map(str, new))
    gone = KNOWN_VIOLATIONS - {(v.path, v.imported) for v in found}
    assert not gone, f"fixed, so remove them from KNOWN_VIOLATIONS: {sorted(gone)}"


def test_every_package_file_is_checked():
    """The walk sees the layers where pyproject puts them (not an empty folder by mistake)."""
    packages = package_dirs(ROOT)
    layers = {layer_of(name, packages) for name in source_files(packages).values()}
    assert {"ir", "solvers", "frontends", "runtimes", FACADE} <= layers
    modules = set(source_files(packages).values())
    assert {"remat_ir.ir.simulator", "remat_ir.solvers.rotor", "remat_ir.cli"} <= modules


def _tree(tmp_path: Path, files: dict[str, str], *, torch_types_folder: str | None = None,
          listed_only: bool = False) -> Path:
    """A throwaway repository: the same package-dir layout as ours, with `files` in it.
    `torch_types_folder`: where remat_ir.torchlib lives, mapped in package-dir, or, with
    `listed_only`, only listed in `packages` (then it must be remat_ir/torchlib)."""
    layers = ["ir", "frontends", "solvers", "runtimes"]
    mapping = [f'"{TOP}" = "{TOP}"'] + [f'"{TOP}.{name}" = "{name}"' for name in layers]
    packages = [TOP] + [f"{TOP}.{name}" for name in layers]
    if torch_types_folder:
        packages.append(f"{TOP}.{TORCH_TYPES}")
        if not listed_only:
            mapping.append(f'"{TOP}.{TORCH_TYPES}" = "{torch_types_folder}"')
        layers.append(torch_types_folder)
    (tmp_path / "pyproject.toml").write_text(
        "[tool.setuptools]\npackages = [" + ", ".join(f'"{p}"' for p in packages) + "]\n\n"
        "[tool.setuptools.package-dir]\n" + "\n".join(mapping) + "\n")
    for folder in [TOP, *layers]:
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / "__init__.py").write_text("")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def test_the_check_catches_injected_violations(tmp_path):
    root = _tree(tmp_path, {
        "solvers/x.py": "import torch\n",
        "ir/y.py": "def f():\n    from remat_ir.solvers import z\n",
        "ir/z.py": "from ..frontends import lowering\n",  # relative, two levels up
        "runtimes/w.py": "from remat_ir.frontends.torch_types import dtype\n",
        "frontends/v.py": "from remat_ir import remat\n",  # the facade
        "solvers/fine.py": "import numpy\nfrom remat_ir import ir\nfrom ..ir import graph\nfrom . import x\n",
        "remat_ir/api.py": "import torch\nfrom remat_ir.solvers import solve\n",  # the facade may
    })
    found = {(v.path, v.line, v.imported, v.target) for v in violations(root)}
    assert found == {
        ("solvers/x.py", 1, "torch", "torch"),
        ("ir/y.py", 2, "remat_ir.solvers", "solvers"),
        ("ir/z.py", 1, "remat_ir.frontends", "frontends"),
        ("runtimes/w.py", 1, "remat_ir.frontends.torch_types", "frontends"),
        ("frontends/v.py", 1, "remat_ir", FACADE),
    }
    message = "\n".join(map(str, violations(root)))
    assert "solvers/x.py:1: solvers imports torch (torch); solvers may import only ir" in message
    assert "ir/y.py:2: ir imports remat_ir.solvers (solvers); ir may import only itself" in message


@pytest.mark.parametrize("folder, listed_only", [("torchlib", False), ("remat_ir/torchlib", False),
                                                 ("remat_ir/torchlib", True)],
                         ids=["own-folder", "mapped-inside-facade", "listed-inside-facade"])
def test_the_shared_torch_types_package_is_read_from_pyproject(tmp_path, folder, listed_only):
    """Wherever pyproject puts `remat_ir.torchlib`, frontends and runtimes may import it, and
    it may import only ir and torch."""
    root = _tree(tmp_path, {
        f"{folder}/types.py": "import torch\nfrom remat_ir.ir import pb\n"
                              "from remat_ir.frontends import torch as lowering\n",
        "runtimes/codegen.py": "from remat_ir.torchlib.types import dtype\n",
        "frontends/torch.py": "from ..torchlib import types\n",
    }, torch_types_folder=folder, listed_only=listed_only)
    assert [(v.path, v.layer, v.imported) for v in violations(root)] == [
        (f"{folder}/types.py", TORCH_TYPES, "remat_ir.frontends.torch")]


def test_a_package_without_a_rule_is_named(tmp_path):
    root = _tree(tmp_path, {})
    with open(root / "pyproject.toml", "a") as f:
        f.write(f'"{TOP}.offload" = "offload"\n')
    (root / "offload").mkdir()
    (root / "offload" / "__init__.py").write_text("")
    with pytest.raises(AssertionError, match="'offload' that this test has no rule for"):
        violations(root)


def test_test_modules_do_not_import_each_other():
    """Shared fixtures live in conftest.py and shared helpers in plain modules (builders,
    strategies, ...): a test module imported by another runs its tests' module-level code
    twice and ties the two files' fixtures together."""
    offending = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import) or isinstance(node, ast.ImportFrom) and not node.module:
                names = [a.name for a in node.names]  # import test_x; from . import test_x
            else:
                names = [node.module] if isinstance(node, ast.ImportFrom) else []
            offending += [f"tests/{path.name}:{node.lineno}: imports {name}" for name in names
                          if name.rpartition(".")[2].startswith("test_")]
    assert not offending, "\n".join(offending)
