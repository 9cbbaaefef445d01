"""The memory model: every rule of how a graph's values occupy memory, in one place.

Memory is counted per *storage* (`Storage` in the schema): several values may
share one (views, in-place results). The rules:

- **Resident storages** (graph inputs: user inputs, parameters, buffers,
  output gradients; constants) are always there and counted apart from the
  activations (`Graph.resident_bytes`).
- **Allocation or view.** Computing a node allocates the storage of each
  output that is neither resident nor the storage of one of the node's inputs
  (`new_storages`); an output sharing an input's storage is a view of it and
  allocates nothing. A node none of whose outputs allocates is a view node
  (`is_view`).
- **Allocations.** Every computation of an allocating output makes a new
  allocation of its storage's bytes, even while an older copy of the same
  storage is still held through a view (a recomputation). An allocation
  counts while any value holding it is live (`Allocations`). Its bytes are the
  storage's rounded up to the device allocator's granularity
  (`Provenance.allocation_granularity_bytes`, 512 on CUDA; `Graph.storage_bytes`).
- **During a step** the live bytes include the new outputs and the node's
  workspace (`Cost.workspace_bytes`); an output recomputed while its old copy
  is live holds both until the step ends, and a user output's old copy, which
  the caller holds, until the end.
- **Buffer snapshots.** A buffer the step updates (BatchNorm's running
  statistics: a `BUFFER_UPDATE` output of its name) takes its new value at the
  end of the forward, and the new value is freed there unless a backward step
  reads it; a backward step that reads the buffer (a recomputation) must see
  the old one, so the old value is copied there and held to the end of the step
  (`snapshot_buffers`). So are the statistics an eval-mode BatchNorm recomputed in
  the backward reads, which the runtime compares with the live ones there.
- **Gradient seeds.** The output gradients (GRADIENT inputs) are resident, but where
  the runtime makes them as the backward starts (`Provenance.runtime_makes_gradient_seeds`,
  graphs lowered from PyTorch) they take memory from there: autograd's seed of a scalar
  loss (`loss.backward()`), and for an output that gets no gradient the runtime's zero
  scalar broadcast to its shape. One element each, held from the start of the backward to
  the end of the step (`gradient_seed_bytes`); on CUDA one 512-byte block each.

Two granularities answer from these rules:

- *Exact*, per allocation: `Allocations` is the state the simulator
  (`simulator.py`) replays a schedule on, and `measure_sequence` replays a
  compute sub-sequence from given live values (a cluster's forward, a
  stage's backward) with frees after last uses, by the same rules.
- *Per node*, `NodeMemory`: what solvers plan with. A node's bytes are the
  storages it allocates; a view node holds the allocation of the node that
  allocated the storage it views (its *root*); outputs nothing reads are
  workspace. It differs from the exact rules where a node's outputs die at
  different times (it keeps or frees a node's results together) and where a
  storage is reallocated by a later node (the first allocator owns it). Its
  `walk` is the approximate sub-sequence measure solvers call in their inner
  loops; `fit_to_budget` in the solvers closes the gap against the simulator.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property

from . import remat_ir_pb2 as pb
from .dtypes import ITEMSIZE
from .graph import Graph


# ----------------------------------------------------------------- the storage rules


def new_storages(graph: Graph, node: pb.Node) -> dict[int, tuple[int, ...]]:
    """Storages that computing `node` allocates, each with the positions in
    `node.outputs` of the outputs holding it (in output order). The one answer
    to "does this node allocate?": an output allocates unless its storage is
    resident or is the storage of one of the node's inputs (a view).
    Cached per node in the graph (the simulator asks at every step)."""
    cache = graph.derived.setdefault("new_storages", {})
    if (known := cache.get(node.id)) is not None:
        return known
    viewed = {graph.value(v).storage_id for v in node.inputs}
    resident = graph.resident_storage_ids
    storages: dict[int, list[int]] = {}
    for position, v in enumerate(node.outputs):
        storage = graph.value(v).storage_id
        if storage not in viewed and storage not in resident:
            storages.setdefault(storage, []).append(position)
    cache[node.id] = {s: tuple(p) for s, p in storages.items()}
    return cache[node.id]


def is_view(graph: Graph, node: pb.Node) -> bool:
    """Whether the node allocates nothing: each output views an input (or a resident tensor)."""
    return not new_storages(graph, node)


def allocated_bytes(graph: Graph, node: pb.Node) -> int:
    """Bytes computing `node` allocates (its new storages), workspace excluded."""
    return sum(graph.storage_bytes(s) for s in new_storages(graph, node))


def activation_storages(graph: Graph, value_ids: Iterable[int]) -> set[int]:
    """The storages of `value_ids` that count as activation memory (not resident)."""
    return {graph.value(v).storage_id for v in value_ids if counted(graph, v)}


def counted(graph: Graph, value_id: int) -> bool:
    """Whether a value's bytes count as activation memory (it is not in a resident storage)."""
    return graph.value(value_id).storage_id not in graph.resident_storage_ids


def snapshot_buffers(graph: Graph, schedule: pb.Schedule) -> list[int]:
    """The buffers (resident value ids) copied at the end of `schedule`'s forward and
    held to the end of the step: those the step updates that a backward step reads, and
    the running statistics a BatchNorm recomputed in the backward reads. Store-everything
    reads none; a BatchNorm recomputed in the backward reads its running statistics.
    Those the step does not update (an eval-mode BatchNorm) are copied to be compared:
    another call's training-mode BatchNorm, eager's or a step's, writes them in place
    without bumping their version, which the runtime's version check cannot see, and the
    recomputation took the new statistics, silently (found by a review). The runtime
    takes the same copies (`runtimes.torch`).

    A step naming no node of the graph is passed over: the simulator asks before it
    checks the backward's steps, and refuses that one when it reaches it (a bare KeyError
    from here refused an external solver's plan, and crashed hiremate where it drops a
    failing leaf solver: found by a review)."""
    derived = graph.derived.get("snapshot_candidates")
    if derived is None:  # the simulator asks at every simulation
        updated = {o.name for o in graph.proto.outputs if o.role == pb.BUFFER_UPDATE}
        derived = graph.derived["snapshot_candidates"] = (
            frozenset(e.value_id for e in graph.proto.inputs if e.name in updated),
            frozenset(e.value_id for e in graph.proto.inputs if graph.value(e.value_id).kind == pb.BUFFER))
    updated, buffers = derived
    if not (buffers or updated):   # updated: parameters written in place too
        return []
    read: set[int] = set()
    nodes = graph.nodes
    for step in schedule.steps[schedule.backward_start:]:
        if step.HasField("compute") and step.compute in nodes:
            node = nodes[step.compute]
            statistics = node.phase == pb.FORWARD and _RUNNING_STATISTICS_OP in node.op
            read.update(v for v in node.inputs if v in updated or (statistics and v in buffers))
    return sorted(read)


#: What the ops reading BatchNorm's running statistics have in their names
#: (`_native_batch_norm_legit_no_training`, `_native_batch_norm_legit_functional`, ...);
#: the only buffers they read are those statistics.
_RUNNING_STATISTICS_OP = "batch_norm"


def gradient_seed_bytes(graph: Graph) -> int:
    """Bytes the backward's start allocates for the step's output gradients, where the
    runtime makes them (`Provenance.runtime_makes_gradient_seeds`): one element of each
    GRADIENT input's dtype, at the device's allocation size. Autograd makes the seed of
    `loss.backward()` (a ones tensor like the loss) inside the step, and the PyTorch
    runtime stands a broadcast zero scalar in for an output that gets no gradient (GPT-2's
    logits beside its loss): each is a fresh allocation, 4 bytes on a CPU but a 512-byte
    block on CUDA, where a tiny random network's measured peak was one block above its
    plan without them (H100). A gradient the caller made before the step is counted too,
    on the safe side."""
    if not graph.proto.provenance.runtime_makes_gradient_seeds:
        return 0
    return sum(graph.allocation_bytes(ITEMSIZE[graph.value(v).dtype]) for v in gradient_inputs(graph))


def gradient_inputs(graph: Graph) -> frozenset[int]:
    """The value ids of the output gradients fed to the backward (GRADIENT inputs), kept
    with the graph's derived facts: the simulator asks at every simulation."""
    ids = graph.derived.get("gradient_inputs")
    if ids is None:
        ids = graph.derived["gradient_inputs"] = frozenset(
            i.value_id for i in graph.proto.inputs if graph.value(i.value_id).kind == pb.GRADIENT)
    return ids


class Structure:
    """A node's inputs and outputs, a value's storage and a node's new storages, read out
    of the protobuf once into plain tuples and dicts: the simulator asks for them at every
    step of every simulation, and reading repeated protobuf fields there was most of its
    time. Cached with the graph's structure (`structure`); costs and a node's flags are
    not here (profiling writes costs without a structural change)."""

    def __init__(self, graph: Graph):
        self.storage = {v.id: v.storage_id for v in graph.proto.values}
        self.inputs = {n.id: tuple(n.inputs) for n in graph.proto.nodes}
        self.outputs = {n.id: tuple(n.outputs) for n in graph.proto.nodes}
        self.fresh = {n.id: tuple(new_storages(graph, n)) for n in graph.proto.nodes}


def structure(graph: Graph) -> Structure:
    """The graph's `Structure`, made once per structural change (`Graph.derived`)."""
    known = graph.derived.get("structure")
    if known is None:
        known = graph.derived["structure"] = Structure(graph)
    return known


# ------------------------------------------------------------------ exact accounting


class Allocations:
    """Live values and the allocations they hold, with byte accounting: the
    exact state a schedule moves through.

    Resident storages are one allocation (`RESIDENT`) that is never counted.
    """

    RESIDENT = 0

    def __init__(self, graph: Graph):
        self.graph = graph
        self.live: dict[int, int] = {}    # value id -> allocation
        self.refs: Counter = Counter()    # allocation -> live values holding it
        self.size: dict[int, int] = {}    # allocation -> bytes
        self.bytes = 0
        #: The caller holds the copy of a user output it was handed, even if it is recomputed.
        self.user_outputs = {o.value_id for o in graph.proto.outputs if o.role == pb.USER_OUTPUT}
        self.structure = structure(graph)
        self.resident_storages = graph.resident_storage_ids

    def storage_of(self, value_id: int) -> int:
        return self.structure.storage[value_id]

    def allocation_of(self, value_id: int) -> int:
        """Allocation a resident value belongs to, or that a live value holds."""
        if self.structure.storage[value_id] in self.resident_storages:
            return self.RESIDENT
        return self.live[value_id]

    def allocate(self, storage_id: int) -> int:
        return self._new(self.graph.storage_bytes(storage_id))

    def _new(self, nbytes: int) -> int:
        """A new allocation of `nbytes`, counted from now."""
        allocation = len(self.size) + 1
        self.size[allocation] = nbytes
        self.bytes += nbytes
        return allocation

    def bind(self, value_id: int, allocation: int) -> None:
        """Make a value live, holding `allocation` (dropping what it held before)."""
        if value_id in self.live:
            self.drop(value_id)
        self.live[value_id] = allocation
        self.refs[allocation] += 1

    def pin(self, value_id: int) -> None:
        """Keep the allocation a value holds counted until the end, whatever happens to the value."""
        self.refs[self.live[value_id]] += 1

    def drop(self, value_id: int) -> None:
        """The value is freed (or offloaded): its allocation goes when nothing else holds it."""
        allocation = self.live.pop(value_id)
        self.refs[allocation] -= 1
        if self.refs[allocation] == 0:
            del self.refs[allocation]
            self.bytes -= self.size.get(allocation, 0)

    def hold(self, nbytes: int) -> None:
        """Count `nbytes` held by no value until the end (buffer snapshots, gradient seeds)."""
        self.refs[self._new(nbytes)] += 1

    def restore(self, value_id: int) -> None:
        """The value comes back (a prefetch) into a fresh allocation of its storage."""
        self.bind(value_id, self.allocate(self.storage_of(value_id)))

    def adopt(self, value_ids: Iterable[int]) -> None:
        """Make values live from the start of a sub-sequence, one allocation per storage."""
        by_storage: dict[int, int] = {}
        for v in value_ids:
            if not counted(self.graph, v):
                continue
            storage = self.storage_of(v)
            if storage not in by_storage:
                by_storage[storage] = self.allocate(storage)
            self.bind(v, by_storage[storage])

    def compute(self, node_id: int) -> int:
        """Run `node_id` (its inputs must be live or resident): bind its outputs
        and return the bytes live while it runs (new outputs and workspace
        included). A user output computed again keeps its old copy counted to
        the end: the caller holds the one it was handed."""
        known, live = self.structure, self.live
        fresh = {s: self.allocate(s) for s in known.fresh[node_id]}
        during = self.bytes + self.graph.node(node_id).cost.workspace_bytes
        viewed: dict[int, int] | None = None     # storage -> allocation, of the inputs
        for v in known.outputs[node_id]:
            storage = known.storage[v]
            allocation = fresh.get(storage)
            if allocation is None:
                if viewed is None:
                    viewed = {known.storage[i]: self.allocation_of(i) for i in known.inputs[node_id]}
                allocation = viewed.get(storage, self.RESIDENT)
            if v in self.user_outputs and v in live:
                self.pin(v)
            self.bind(v, allocation)
        return during

    def held_bytes(self, value_ids: Iterable[int]) -> int:
        """Bytes of the distinct allocations the live `value_ids` hold."""
        allocations = {self.live[v] for v in value_ids if v in self.live}
        return sum(self.size.get(a, 0) for a in allocations)


def measure_sequence(graph: Graph, sequence: Sequence[int], *, live: Iterable[int] = (),
                     keep: Iterable[int] = ()) -> tuple[int, int]:
    """Peak and final activation bytes of computing `sequence` from the `live`
    values, by the exact rules: each value is freed after its last use in the
    sequence unless it is in `keep`, a graph output or resident. Inputs of the
    sequence's nodes that are neither live nor computed earlier in it are
    assumed held elsewhere (counted apart), as a cluster's inputs are held by
    its parent. The sub-sequence mode of the simulator, without its checks."""
    state = Allocations(graph)
    state.adopt(live)
    kept = set(keep) | graph.resident_value_ids | graph.output_value_ids
    last: dict[int, int] = {}
    for i, n in enumerate(sequence):
        for v in graph.node(n).inputs:
            last[v] = i
    peak = state.bytes
    for i, n in enumerate(sequence):
        node = graph.node(n)
        peak = max(peak, state.compute(n))
        for v in (*node.inputs, *node.outputs):
            if v in state.live and v not in kept and last.get(v, -1) <= i:
                state.drop(v)
    return peak, state.bytes


# ------------------------------------------------------------------- per node


class NodeMemory:
    """The memory model at node granularity over an execution `order` of nodes:
    what each node allocates, which node's allocation a view node holds, what
    counts only while a node runs. Derived from `new_storages`; see the module
    docstring for how it differs from the exact rules."""

    def __init__(self, graph: Graph, order: Sequence[int]):
        self.graph = graph
        self.order = list(order)
        self.position = {n: i for i, n in enumerate(self.order)}

    def node_inputs(self, n: int) -> list[int]:
        """Producer nodes of `n`'s inputs (resident values have none), in order, once each."""
        seen = []
        for v in self.graph.node(n).inputs:
            p = self.graph.producer(v)
            if p is not None and p not in seen:
                seen.append(p)
        return seen

    @cached_property
    def node_users(self) -> dict[int, list[int]]:
        users: dict[int, list[int]] = {n: [] for n in self.order}
        for n in self.order:
            for p in self.node_inputs(n):
                users[p].append(n)
        return users

    @cached_property
    def allocator(self) -> dict[int, int]:
        """Storage -> the first node in the order that allocates it."""
        allocator: dict[int, int] = {}
        for n in self.order:
            for s in new_storages(self.graph, self.graph.node(n)):
                allocator.setdefault(s, n)
        return allocator

    @cached_property
    def _split(self) -> tuple[dict[int, int], dict[int, int]]:
        """Per node: bytes it allocates that some node reads or that hold a graph
        output (they outlive it), and bytes nothing reads (freed as soon as it ran)."""
        g = self.graph
        read = {g.value(v).storage_id for n in self.order for v in g.node(n).inputs}
        read |= {g.value(v).storage_id for v in g.output_value_ids}
        memory = {n: 0 for n in self.order}
        transient = {n: 0 for n in self.order}
        for s, n in self.allocator.items():
            (memory if s in read else transient)[n] += g.storage_bytes(s)
        return memory, transient

    @property
    def memory(self) -> dict[int, int]:
        """Bytes each node allocates that outlive it (some later node reads them)."""
        return self._split[0]

    @cached_property
    def workspace(self) -> dict[int, int]:
        """Bytes a node holds only while it runs: its workspace and the outputs nothing reads."""
        transient = self._split[1]
        return {n: self.graph.node(n).cost.workspace_bytes + transient[n] for n in self.order}

    @cached_property
    def view_roots(self) -> dict[int, frozenset[int]]:
        """For a node whose outputs view other nodes' allocations: those nodes (several
        where its outputs view the allocations of several inputs)."""
        g, roots = self.graph, {}
        for n in self.order:
            read = {g.value(v).storage_id for v in g.node(n).inputs}
            for v in g.node(n).outputs:
                s = g.value(v).storage_id
                if s in read and s in self.allocator and self.allocator[s] != n:
                    roots.setdefault(n, set()).add(self.allocator[s])
        return {n: frozenset(r) for n, r in roots.items()}

    @cached_property
    def view_root(self) -> dict[int, int]:
        """For a view node, the one root that node-granularity estimates charge it to (the
        latest allocated of `view_roots`). Where a set of kept nodes must hold every
        allocation it keeps alive, close it with `with_roots` instead."""
        return {n: max(r, key=self.position.__getitem__) for n, r in self.view_roots.items()}

    def root(self, n: int) -> int:
        """The node whose allocation `n`'s results hold (itself unless a view)."""
        return self.view_root.get(n, n)

    def with_roots(self, nodes) -> set[int]:
        """`nodes` and every node whose allocation their results hold, transitively (a
        root may itself view another allocation with its other outputs): what keeping
        `nodes` keeps alive, at node granularity."""
        closed = set(nodes)
        stack = list(closed)
        while stack:
            for r in self.view_roots.get(stack.pop(), ()):
                if r not in closed:
                    closed.add(r)
                    stack.append(r)
        return closed

    @cached_property
    def allocations(self) -> dict[int, list[tuple[int, int]]]:
        """Per node, the storages it allocates that outlive it, with their bytes."""
        g, allocations = self.graph, {n: [] for n in self.order}
        for s, n in self.allocator.items():
            if self.memory[n]:
                allocations[n].append((s, g.storage_bytes(s)))
        return allocations

    def bytes_read(self, n: int, readers) -> int:
        """Bytes of `n`'s allocations that the `readers` nodes read: what holding `n`
        for them costs (a dropout's backward reads its mask, not its output; memory
        is freed per storage)."""
        g = self.graph
        read = {g.value(v).storage_id for r in readers for v in g.node(r).inputs}
        return sum(b for s, b in self.allocations[n] if s in read)

    @cached_property
    def _output_storages(self) -> tuple[dict[int, int], dict[int, int]]:
        held = {n: 0 for n in self.order}
        pinned_by: dict[int, int] = {}
        for v in self.graph.output_value_ids:
            s, producer = self.graph.value(v).storage_id, self.graph.producer(v)
            if s not in self.allocator or producer is None:
                continue
            root = self.allocator[s]
            if producer == root:
                held[root] += self.graph.storage_bytes(s)
            elif self.position[producer] < self.position.get(pinned_by.get(root), len(self.order)):
                pinned_by[root] = producer
        return held, {r: n for r, n in pinned_by.items() if not held[r]}

    @property
    def output_bytes(self) -> dict[int, int]:
        """Per node, the bytes it allocates that hold a graph output it returns (live to the end)."""
        return self._output_storages[0]

    @property
    def kept_by_output_view(self) -> dict[int, int]:
        """Allocating node -> the node whose graph-output view keeps that allocation live
        to the end, from when it runs (e.g. a gradient returned as a view)."""
        return self._output_storages[1]

    def walk(self, live: set[int], sequence: list[int], keep: Iterable[int] | Mapping[int, int],
             counted_apart: frozenset[int], saved: Mapping[int, int] | None = None) -> tuple[int, int]:
        """Peak and final bytes running `sequence` from the `live` nodes' results,
        freeing results after their last use in the sequence unless in `keep`:
        `measure_sequence` at node granularity, for solvers' inner loops. A node
        appearing again (a recomputation) starts a new life of its results, as in
        `from_compute_sequence`: the earlier one ends at its last use before it.

        How it differs from the exact rules: a node's results are held or freed
        together, through its root; results in `counted_apart` cost nothing here
        (they are held all along). To follow the per-storage frees, `keep` may
        map results to the bytes of them that stay (a gradient's node also
        returning a parameter gradient), and `saved` maps results kept for a
        backward to the bytes of them it reads (`bytes_read`), which stay from
        the start if they are live, after their last use in the sequence otherwise."""
        root = self.root

        def size(n: int) -> int:
            return 0 if n in counted_apart else self.memory[n]

        saved = {root(n): b for n, b in (saved or {}).items()}
        partly = dict(saved)
        if isinstance(keep, Mapping):
            partly.update((root(n), b) for n, b in keep.items())
            keep = set()
        keep = {root(n) for n in keep}
        ends: list[list[int]] = [[] for _ in sequence]   # results whose life ends there
        seen: dict[int, int] = {}                        # root -> latest use or computation
        for i, n in enumerate(sequence):
            for p in {root(p) for p in self.node_inputs(n)}:
                seen[p] = i
            if root(n) == n and n in seen:               # computed again: the old life ends
                ends[seen[n]].append(n)
            seen[root(n)] = i
        for r, i in seen.items():
            ends[i].append(r)
        holding = {r: min(size(r), saved.get(r, size(r))) for r in map(root, live)}
        current = sum(holding.values())
        peak = current
        for i, n in enumerate(sequence):
            peak = max(peak, current + size(n) + self.workspace[n])
            if root(n) not in holding:
                holding[root(n)] = size(root(n))
                current += holding[root(n)]
            for p in ends[i]:
                if p in holding and p not in keep:
                    left = min(holding[p], partly.get(p, 0))
                    current -= holding[p] - left
                    if left:
                        holding[p] = left
                    else:
                        del holding[p]
        return peak, current
