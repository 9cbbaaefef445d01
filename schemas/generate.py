"""Generate (or check) the Python bindings of schemas/remat_ir.proto.

The bindings are committed as ir/remat_ir_pb2.py(.pyi) so that installing the
package needs no protobuf compiler. This script regenerates them with the
compiler from the pinned `grpcio-tools` wheel; `--check` compares instead of
writing, and fails when the committed files are stale.

    python schemas/generate.py          # regenerate
    python schemas/generate.py --check  # exit 1 if stale
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "schemas" / "remat_ir.proto"
TARGET = ROOT / "ir"
GENERATED = ("remat_ir_pb2.py", "remat_ir_pb2.pyi")


def run_protoc(out_dir: Path) -> None:
    """Compile the schema into `out_dir` with grpcio-tools' bundled protoc."""
    from grpc_tools import protoc

    status = protoc.main([
        "protoc",
        f"-I{SCHEMA.parent}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        str(SCHEMA),
    ])
    if status != 0:
        raise SystemExit(f"protoc failed on {SCHEMA} (exit {status})")


def stale_files() -> list[str]:
    """Names of committed generated files that differ from a fresh compile."""
    with tempfile.TemporaryDirectory() as tmp:
        run_protoc(Path(tmp))
        return [name for name in GENERATED
                if not (TARGET / name).exists()
                or (Path(tmp) / name).read_bytes() != (TARGET / name).read_bytes()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="fail if the committed bindings are stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files()
        if stale:
            print(f"stale generated code: {', '.join('ir/' + s for s in stale)}; "
                  "run `make proto` and commit the result", file=sys.stderr)
            return 1
        print("generated code is current")
        return 0
    run_protoc(TARGET)
    print(f"wrote {', '.join('ir/' + g for g in GENERATED)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
