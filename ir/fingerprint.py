"""What makes two lowerings of a model the same step: a digest of the graph without costs.

Lowering the same model with the same inputs twice gives the same nodes, values,
storages and arguments, but profiled times differ from run to run. The
fingerprint hashes everything that decides what a schedule does and what
memory it needs (ops, arguments, shapes, strides, storages with their bytes,
workspace bytes, inputs, outputs, frontend metadata) and leaves out what only
prices time (`Cost` times, FLOPs, bytes moved, their source) and what a solver
wrote (schedules, hierarchy). A schedule of one lowering is therefore valid on
another with the same fingerprint, at the same peak: the plan cache and the
remembered smallest-feasible plans rely on this.
"""

from __future__ import annotations

import hashlib

from . import remat_ir_pb2 as pb


def structure_fingerprint(graph, *, measured_memory: bool = True, costs: bool = False,
                          metadata: bool = True) -> str:
    """Hex SHA-256 of `graph` (an `ir.Graph` or `pb.Graph`) without times and plans.

    `measured_memory=False` also leaves out what profiling measures (workspace bytes,
    storages grown to the kernel's real size): the fingerprint of a trace, equal before
    and after its costs are estimated. `costs=True` keeps the nodes' costs and the
    provenance (cost model, host link): equal fingerprints then price every plan alike,
    so that what a solver derives from the graph alone (rotor's chain) can be reused
    for it. `metadata=False` leaves out the graph's metadata: what the frontend records for
    the runtime (attributes a call must match), which no plan's peak or time depends on."""
    proto = graph.proto if hasattr(graph, "proto") else graph
    stripped = pb.Graph()
    stripped.CopyFrom(proto)
    del stripped.schedules[:]
    stripped.ClearField("hierarchy")
    if not metadata:
        stripped.ClearField("metadata")
    if costs:
        return hashlib.sha256(stripped.SerializeToString(deterministic=True)).hexdigest()
    stripped.ClearField("provenance")
    for node in stripped.nodes:
        workspace = node.cost.workspace_bytes if measured_memory else 0
        node.ClearField("cost")
        node.cost.workspace_bytes = workspace
    if not measured_memory:
        for storage in stripped.storages:
            storage.ClearField("size_bytes")
    return hashlib.sha256(stripped.SerializeToString(deterministic=True)).hexdigest()


def wiring_fingerprint(graph) -> str:
    """Hex SHA-256 of what a schedule names in `graph`: each node's op, phase, inputs and
    outputs, each value's storage, the graph's inputs and outputs; not shapes, arguments,
    bytes or costs. Lowerings of one model for inputs of other shapes (another sequence
    length, a smaller last batch) are wired alike: a schedule of one names the same
    nodes and values in the other, where the simulator is the judge of whether it is
    valid and of the memory it takes (`solvers.solve`'s `reuse`)."""
    proto = graph.proto if hasattr(graph, "proto") else graph
    digest = hashlib.sha256()
    for node in proto.nodes:
        digest.update(repr((node.id, node.op, node.phase, tuple(node.inputs), tuple(node.outputs))).encode())
    for value in proto.values:
        digest.update(repr((value.id, value.storage_id)).encode())
    digest.update(repr([(i.value_id, i.name) for i in proto.inputs]).encode())
    digest.update(repr([(o.value_id, o.role) for o in proto.outputs]).encode())
    return digest.hexdigest()
