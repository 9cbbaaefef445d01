"""The remat IR in Python: graphs, files, validation, schedules and the simulator.

    from remat_ir import ir
    g = ir.load("model.rir")              # binary or JSON, validated
    result = ir.simulate(g, g.schedules[0])
    result.peak_bytes, result.total_time_s, result.violation

The protobuf classes generated from schemas/remat_ir.proto are `ir.pb`.
This package never imports torch: solvers in any language see the same data.
"""

from . import remat_ir_pb2 as pb
from .arguments import Device, DTypeArg, LayoutArg, MemoryFormatArg, TensorRef
from .errors import FormatError, InvalidGraph, InvalidSchedule, RematIRError
from .graph import FORMAT_VERSION, Graph
from .schedules import (compute_sequence, forward_length, from_compute_sequence, recompute_all,
                        simulated_compute_sequence, store_all)
from .serialization import dumps, dumps_json, load, loads, save
from .simulator import SimulationResult, Violation, check, simulate
from .validation import find_problems, validate

__all__ = [
    "pb", "Graph", "FORMAT_VERSION",
    "load", "loads", "save", "dumps", "dumps_json",
    "validate", "find_problems",
    "simulate", "check", "SimulationResult", "Violation",
    "store_all", "recompute_all", "from_compute_sequence", "simulated_compute_sequence",
    "compute_sequence", "forward_length",
    "TensorRef", "DTypeArg", "Device", "MemoryFormatArg", "LayoutArg",
    "RematIRError", "FormatError", "InvalidGraph", "InvalidSchedule",
]
