"""Plan cache speed-up: `remat()` in a fresh process, without and with a populated cache.

    python benchmarks/plan_cache.py [--repeats 2] [--layers 12] [--width 128 --seq 128 --batch 4]

Each repeat runs, in new processes one after the other, a cold `remat()` (empty cache
directory: trace, profile, plan) and a warm one (same directory: trace, then the
profiled graph and the plan come from disk), so the ratio is measured pairwise on the
same machine state. Model: GPT-2 (transformers, random weights, vocabulary 8192), 12 layers
by default, budget 50%, default solver. Tracing is not cached (it is what finds the entry),
so the speed-up grows with what profiling and planning cost: small widths trace as long as
large ones. Writes benchmarks/results/plan_cache-<width>.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = """
import json, sys, time, torch
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging
logging.set_verbosity_error()
import remat_ir
torch.manual_seed(0)
config = GPT2Config(n_layer={layers}, n_head=4, n_embd={width}, vocab_size=8192, n_positions={seq},
                    use_cache=False, bos_token_id=0, eos_token_id=0)
model = GPT2LMHeadModel(config).train()
ids = torch.randint(0, 8192, ({batch}, {seq}))
start = time.perf_counter()
scheduled = remat_ir.remat(model, dict(input_ids=ids, labels=ids), budget="50%", cache_dir={cache!r})
seconds = time.perf_counter() - start
print(json.dumps(dict(seconds=seconds, nodes=len(scheduled.graph.proto.nodes),
                      peak=scheduled.schedule.predicted_peak_bytes)))
"""


def run(cache: str, args) -> dict:
    child = CHILD.format(cache=cache, layers=args.layers, width=args.width, seq=args.seq, batch=args.batch)
    done = subprocess.run([sys.executable, "-c", child],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args()
    pairs = []
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory() as cache:
            cold, warm = run(cache, args), run(cache, args)
        assert cold["peak"] == warm["peak"] and cold["nodes"] == warm["nodes"]
        pairs.append(dict(cold_s=round(cold["seconds"], 2), warm_s=round(warm["seconds"], 2),
                          speedup=round(cold["seconds"] / warm["seconds"], 1)))
        print(f"repeat {repeat + 1}/{args.repeats}: cold {cold['seconds']:.1f} s, warm "
              f"{warm['seconds']:.1f} s, {pairs[-1]['speedup']}x ({cold['nodes']} IR nodes)", flush=True)
    result = dict(model=f"GPT-2 {args.layers} layers, width {args.width}, seq {args.seq}, "
                        f"batch {args.batch}, vocabulary 8192", budget="50%",
                  solver="hiremate (default)", nodes=cold["nodes"], pairs=pairs,
                  median_speedup=statistics.median(p["speedup"] for p in pairs))
    out = HERE / "results" / f"plan_cache-{args.width}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"median speed-up {result['median_speedup']}x; wrote {out}")


if __name__ == "__main__":
    main()
