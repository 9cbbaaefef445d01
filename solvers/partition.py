"""H-Partition, bottom to top (HiRemate): the forward graph grouped into a tree of
small clusters, so that every optimisation problem HiRemate solves is small.

Each round works on the current level's graph (original forward nodes and the
clusters made so far) and collects candidate groups:

- *sequences*: maximal chains whose links have one user and one input (long
  chains are cut into pieces of at most `max_cluster` parts);
- *flows*: a part with several users, its immediate post-dominator (where
  all its outgoing paths meet again), and every part between the two.

Candidates bigger than `max_cluster` parts are dropped. The rest are taken
greedily, best merge value first: small interface memory (bytes entering and
leaving the group) and small size, `-(in + out) * size ** 0.5`, skipping a
group that overlaps one already taken or whose contraction would close a
cycle. Every taken group becomes a cluster one level up. Rounds repeat until
the top has at most `max_top` parts; a round that merges nothing falls back to
cutting the top's topological order into intervals (always cycle-free).

Forward nodes that read no computed result (constants, mask slices, embedding
lookups) are left out of the rounds and join the smallest cluster holding all
their readers. Backward nodes join the cluster of the forward node they differentiate
(or, unknown, of the latest forward node they read), so that a cluster names
both halves of its training subgraph. Clusters with equal `signature` are
structurally identical (same ops, arguments, shapes and wiring; e.g. the blocks of
a transformer): HiRemate solves one of them and reuses its options, measured again
with each copy's own costs.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import networkx as nx

from remat_ir.ir import Graph, pb

from .base import BadRequest, quiet
from .structure import TrainingGraph

MAX_CLUSTER = 20   # M_l: parts per cluster
MAX_TOP = 30       # M_t: parts at the top
#: A round whose candidates make fewer clusters than this, leaving the top above `max_top`,
#: cuts the top into intervals instead: else a nested graph (a U-Net's skip connections)
#: grows one cluster a part per round, each level cutting its choices to a few options.
MIN_ROUND_CLUSTERS = 2


@dataclass
class Cluster:
    """A group of parts (original forward nodes and smaller clusters)."""
    id: int
    level: int
    nodes: list[int]                         # original forward nodes directly inside
    children: list[Cluster] = field(default_factory=list)
    #: Forward nodes that read no computed result (a constant, a slice of a mask buffer,
    #: an embedding lookup), attached to the smallest cluster holding all their readers.
    attached: list[int] = field(default_factory=list)
    backward: list[int] = field(default_factory=list)   # backward nodes attached (leaves)
    #: For each attached backward node, the forward node of this cluster it belongs to
    #: (None: it reads no forward result; only at the root).
    owner: dict[int, int | None] = field(default_factory=dict)
    signature: str = ""

    def forward_nodes(self) -> list[int]:
        """Every original forward node inside, at any depth."""
        out = self.nodes + self.attached
        for child in self.children:
            out += child.forward_nodes()
        return out

    def walk(self) -> Iterable[Cluster]:
        """This cluster and every cluster below it, children first."""
        for child in self.children:
            yield from child.walk()
        yield self


@dataclass
class Partition:
    """The partition tree of a graph's forward pass."""
    root: Cluster
    rounds: int

    def clusters(self) -> list[Cluster]:
        return list(self.root.walk())


def partition(graph: Graph, *, max_cluster: int = MAX_CLUSTER, max_top: int = MAX_TOP,
              progress: Callable[[str], None] = quiet) -> Partition:
    """H-Partition of `graph`'s forward nodes (see the module docstring)."""
    if max_cluster < 2:
        raise BadRequest(f"max_cluster must be at least 2 parts, not {max_cluster}")
    if max_top < 2:
        raise BadRequest(f"max_top must be at least 2 parts, not {max_top}")
    return _Partitioner(TrainingGraph(graph), max_cluster, max_top, progress).run()


def stored_partition(graph: Graph) -> Partition | None:
    """The partition tree stored in the graph's hierarchy (by `remat-ir partition`,
    an earlier hiremate run or by hand), or None when it has none.

    Only the grouping of forward nodes is read: constants' readers, backward
    nodes and signatures are attached again as `partition` attaches them, so a
    stored tree gives the same clusters as the run that stored it. Raises
    BadRequest when the tree does not partition the forward graph into convex
    clusters."""
    if not graph.proto.hierarchy.clusters:
        return None
    return _Partitioner(TrainingGraph(graph), MAX_CLUSTER, MAX_TOP, quiet).rebuild(graph.proto.hierarchy)


class _Partitioner:
    def __init__(self, tg: TrainingGraph, max_cluster: int, max_top: int, progress):
        self.tg, self.max_cluster, self.max_top, self.progress = tg, max_cluster, max_top, progress
        self.position = {n: i for i, n in enumerate(tg.forward)}
        # Interface bytes of a node's results: the allocation they live in.
        self.bytes = {n: tg.memory[tg.root(n)] for n in tg.forward}
        self.next_id = 0
        self.clusters: dict[int, Cluster] = {}
        # Parts are keyed by ("n", node) or ("c", cluster id).
        forward = set(tg.forward)
        #: Forward nodes reading no computed result, with forward readers: they stay out
        #: of the level graph, where they would hang beside the groups they feed.
        self.sources = {n for n in tg.forward if not tg.node_inputs(n)
                        and any(u in forward for u in tg.node_users[n])}
        self.level_graph = nx.DiGraph()
        for n in tg.forward:
            if n not in self.sources:
                self.level_graph.add_node(("n", n), members=frozenset([n]))
        for n in tg.forward:
            for p in tg.node_inputs(n):
                if p in forward and p not in self.sources:
                    self.level_graph.add_edge(("n", p), ("n", n))

    # ---------------------------------------------------------------- rounds

    def run(self) -> Partition:
        rounds = 0
        while self.level_graph.number_of_nodes() > self.max_top:
            rounds += 1
            candidates = self._candidates()
            taken, removed = self._round(candidates, dry=True)
            still = self.level_graph.number_of_nodes() - removed
            merged = 0
            if taken >= MIN_ROUND_CLUSTERS or still <= self.max_top:
                merged = self._round(candidates)[0]
            if not merged:
                merged = self._round(self._intervals())[0]
            self.progress(f"partition: round {rounds}, {merged} clusters made, "
                          f"{self.level_graph.number_of_nodes()} parts at the top")
        top = list(nx.topological_sort(self.level_graph))
        if len(top) == 1 and top[0][0] == "c":
            root = self.clusters[top[0][1]]
        else:
            root = self._make_cluster(top)
        self._attach_sources(root)
        self._attach_backward(root)
        for c in root.walk():
            c.signature = self._signature(c)
        return Partition(root, rounds)

    def rebuild(self, hierarchy: pb.Hierarchy) -> Partition:
        """`run`'s result for a tree of forward nodes read from `hierarchy`."""
        stored = {c.id: c for c in hierarchy.clusters}

        def bad(problem: str) -> BadRequest:
            return BadRequest(f"the hierarchy stored in graph {self.tg.graph.name!r} {problem}; "
                              "run `remat-ir partition` again, or clear the graph's hierarchy "
                              "to let hiremate partition it")

        if not hierarchy.HasField("root_id") or hierarchy.root_id not in stored:
            raise bad("names no root cluster among its clusters")
        forward = set(self.tg.forward)
        parent: dict[int, int] = {}
        home: dict[int, int] = {}
        for c in hierarchy.clusters:
            for k in c.children:
                if k not in stored or k in parent or k == hierarchy.root_id:
                    raise bad(f"gives cluster {c.name or c.id} a child {k} that does not exist "
                              "or has another parent")
                parent[k] = c.id
            for n in c.node_ids:
                if n in forward and n not in self.sources:
                    if n in home:
                        raise bad(f"puts {self.tg.graph.describe_node(n)} in two clusters")
                    home[n] = c.id
        if missing := [n for n in self.tg.forward if n not in home and n not in self.sources]:
            raise bad(f"leaves {self.tg.graph.describe_node(missing[0])} "
                      f"(and {len(missing) - 1} more forward nodes) out")

        def build(cluster_id: int, depth: int) -> Cluster:
            if depth > len(stored):
                raise bad("has a cycle of children")
            c = stored[cluster_id]
            children = [build(k, depth + 1) for k in c.children]
            nodes = sorted((n for n in c.node_ids if home.get(n) == c.id), key=self.position.__getitem__)
            if not nodes and not children:
                raise bad(f"has an empty cluster {c.name or c.id}")
            cluster = Cluster(c.id, 1 + max((k.level for k in children), default=-1), nodes, children)
            cluster.children.sort(key=lambda k: min(self.position[n] for n in k.forward_nodes()))
            return cluster

        root = build(hierarchy.root_id, 0)
        if unreachable := set(stored) - {c.id for c in root.walk()}:
            raise bad(f"has clusters that are not under the root ({sorted(unreachable)[:5]})")
        for c in root.walk():
            if not self._convex_nodes(set(c.forward_nodes())):
                raise bad(f"has a cluster ({c.id}) that a path leaves and re-enters: "
                          "a cluster must be convex")
        self._attach_sources(root)
        self._attach_backward(root)
        for c in root.walk():
            c.signature = self._signature(c)
        # A tree with no cluster below the root is what a graph small enough for one
        # flat level gives (no round ran).
        return Partition(root, root.level)

    def _convex_nodes(self, inside: set[int]) -> bool:
        """No forward path leaves `inside` and comes back."""
        users = self.tg.node_users
        last = max(self.position[n] for n in inside)
        stack = [u for n in inside for u in users[n] if u in self.position and u not in inside]
        seen = set(stack)
        while stack:
            x = stack.pop()
            for y in users[x]:
                if y in inside:
                    return False
                if y in self.position and y not in seen and self.position[y] < last:
                    seen.add(y)
                    stack.append(y)
        return True

    def _round(self, candidates: list[tuple[float, list]], dry: bool = False) -> tuple[int, int]:
        """Merge the best non-overlapping candidates that keep the graph acyclic: the
        clusters made and the parts removed from the top (`dry`: only count them,
        each group checked against the graph as it is)."""
        taken: set = set()
        merged = removed = 0
        for _, group in sorted(candidates, key=lambda c: -c[0]):
            if taken.intersection(group) or not self._convex(group):
                continue
            taken.update(group)
            if not dry:
                self._contract(group)
            merged += 1
            removed += len(group) - 1
        return merged, removed

    # ------------------------------------------------------------ candidates

    def _candidates(self) -> list[tuple[float, list]]:
        core = self._core()
        groups: dict[frozenset, list] = {}
        for group in self._sequences(core) + self._flows(core):
            group = self._with_dangling(group, core)
            if 2 <= len(group) <= self.max_cluster and len(group) < self.level_graph.number_of_nodes():
                groups.setdefault(frozenset(group), group)
        return [(self._value(g), g) for g in groups.values()]

    def _core(self) -> nx.DiGraph:
        """The level graph without dangling parts: results only backward reads
        (a `detach` of a softmax, a mask), which would otherwise end paths early
        and hide where a flow's paths meet again."""
        core = self.level_graph.copy()
        keep = {part for part, members in core.nodes(data="members")
                if members & self.tg.output_nodes}
        sinks = [n for n in core if core.out_degree(n) == 0 and n not in keep]
        while sinks:
            preds = {p for n in sinks for p in core.predecessors(n)}
            core.remove_nodes_from(sinks)
            sinks = [n for n in preds if core.out_degree(n) == 0 and n not in keep]
        return core

    def _with_dangling(self, group: list, core: nx.DiGraph) -> list:
        """The group, the dangling parts hanging only from it, and the parts that feed
        only it and hang off nothing or off results shared with other parts (a
        time embedding's projection into one U-Net block): alone, they would
        hang beside the group until the top."""
        H, inside = self.level_graph, set(group)
        stack = list(group)
        while stack:
            part = stack.pop()
            for d in H.successors(part):
                if d not in core and d not in inside and set(H.predecessors(d)) <= inside:
                    inside.add(d)
                    stack.append(d)
            for p in H.predecessors(part):
                if p not in inside and set(H.successors(p)) <= inside and all(
                        H.out_degree(q) > 1 for q in H.predecessors(p)):
                    inside.add(p)
        return sorted(inside, key=self._first_position)

    def _sequences(self, H: nx.DiGraph) -> list[list]:
        def linked(u, v) -> bool:
            return H.out_degree(u) == 1 and H.in_degree(v) == 1

        chains = []
        for u in nx.topological_sort(H):
            preds = list(H.predecessors(u))
            if len(preds) == 1 and linked(preds[0], u):
                continue  # not the head of a chain
            chain = [u]
            while H.out_degree(chain[-1]) == 1:
                v = next(iter(H.successors(chain[-1])))
                if not linked(chain[-1], v):
                    break
                chain.append(v)
            if len(chain) >= 2:
                pieces = math.ceil(len(chain) / self.max_cluster)
                size = math.ceil(len(chain) / pieces)
                chains += [chain[i:i + size] for i in range(0, len(chain), size)]
        return chains

    def _flows(self, H: nx.DiGraph) -> list[list]:
        if H.number_of_nodes() == 0:
            return []
        exit_ = ("exit", 0)
        R = H.reverse(copy=True)
        R.add_edges_from((exit_, n) for n in H if H.out_degree(n) == 0)
        post_dominator = nx.immediate_dominators(R, exit_)
        flows = []
        for u in H:
            if H.out_degree(u) < 2:
                continue
            p = post_dominator.get(u)
            if p is None or p == exit_:
                continue
            group = self._between(H, u, p)
            if group is not None:
                flows.append(group)
        return flows

    def _between(self, H: nx.DiGraph, u, p) -> list | None:
        """u, p and every part on a path from u to p; None past `max_cluster` parts."""
        reach, stack = {u}, [u]
        while stack:
            x = stack.pop()
            if x == p:
                continue
            for y in H.successors(x):
                if y not in reach:
                    reach.add(y)
                    if len(reach) > 4 * self.max_cluster:
                        return None
                    stack.append(y)
        group, stack = {p}, [p]
        while stack:
            x = stack.pop()
            for y in H.predecessors(x):
                if y in reach and y not in group:
                    group.add(y)
                    stack.append(y)
        if u not in group or len(group) > self.max_cluster:
            return None
        return sorted(group, key=self._first_position)

    def _intervals(self) -> list[tuple[float, list]]:
        """The top's topological order cut into intervals of at most `max_cluster`
        parts, as few as the top needs (an interval never closes a cycle)."""
        order = list(nx.lexicographical_topological_sort(self.level_graph, key=self._first_position))
        size = min(self.max_cluster, max(2, math.ceil(len(order) / self.max_top)))
        return [(0.0, order[i:i + size]) for i in range(0, len(order), size) if len(order[i:i + size]) > 1]

    def _value(self, group: list) -> float:
        inside = set(group)
        H = self.level_graph
        entering = {p for g in group for p in H.predecessors(g) if p not in inside}
        leaving = {g for g in group if any(s not in inside for s in H.successors(g))}
        interface = sum(self._out_bytes(p) for p in entering) + sum(self._out_bytes(g) for g in leaving)
        return -(interface + 1) * len(group) ** 0.5

    def _out_bytes(self, part) -> int:
        """Bytes of the results a part passes on (its members read outside it)."""
        H = self.level_graph
        members = H.nodes[part]["members"]
        return sum(self.bytes[n] for n in members
                   if any(u not in members for u in self.tg.node_users[n] if u in self.position))

    # ------------------------------------------------------------- contraction

    def _convex(self, group: list) -> bool:
        """No path leaves the group and comes back (contracting it keeps a DAG)."""
        H = self.level_graph
        inside = set(group)
        stack = [s for g in group for s in H.successors(g) if s not in inside]
        seen = set(stack)
        while stack:
            x = stack.pop()
            for y in H.successors(x):
                if y in inside:
                    return False
                if y not in seen:
                    seen.add(y)
                    stack.append(y)
        return True

    def _contract(self, group: list) -> None:
        H = self.level_graph
        cluster = self._make_cluster(group)
        part = ("c", cluster.id)
        members = frozenset().union(*(H.nodes[g]["members"] for g in group))
        preds = {p for g in group for p in H.predecessors(g)} - set(group)
        succs = {s for g in group for s in H.successors(g)} - set(group)
        H.remove_nodes_from(group)
        H.add_node(part, members=members)
        H.add_edges_from((p, part) for p in preds)
        H.add_edges_from((part, s) for s in succs)

    def _make_cluster(self, group: list) -> Cluster:
        children = [self.clusters[g[1]] for g in group if g[0] == "c"]
        nodes = sorted((g[1] for g in group if g[0] == "n"), key=self.position.__getitem__)
        cluster = Cluster(self.next_id, 1 + max((c.level for c in children), default=-1), nodes, children)
        cluster.children.sort(key=lambda c: min(self.position[n] for n in c.forward_nodes()))
        self.clusters[cluster.id] = cluster
        self.next_id += 1
        return cluster

    def _first_position(self, part) -> int:
        return min(self.position[n] for n in self.level_graph.nodes[part]["members"])

    # ---------------------------------------------------------------- backward

    def _attach_sources(self, root: Cluster) -> None:
        """Each source to the smallest cluster holding all its forward readers: its
        only edges then stay inside, so every cluster stays convex."""
        parent: dict[int, Cluster | None] = {root.id: None}
        home: dict[int, Cluster] = {}
        for c in root.walk():
            home.update((n, c) for n in c.nodes)
            parent.update((k.id, c) for k in c.children)

        def ancestry(c: Cluster) -> list[Cluster]:
            chain = [c]
            while parent[chain[-1].id] is not None:
                chain.append(parent[chain[-1].id])
            return chain

        forward = set(self.tg.forward)
        for n in self.sources:
            chains = [ancestry(home[u]) for u in self.tg.node_users[n]
                      if u in forward and u not in self.sources]
            common = set.intersection(*({c.id for c in chain} for chain in chains))
            next(c for c in chains[0] if c.id in common).attached.append(n)

    def _attach_backward(self, root: Cluster) -> None:
        """Each backward node to the leaf-most cluster holding the forward node it
        belongs to: the one it differentiates (its `forward_node_id`), else the
        latest forward node it reads. A node with neither (a sum of gradient
        contributions, e.g. where a residual branch meets the main path) goes
        with the earliest backward node that reads its result, else with the
        latest one it reads: the gradient of a result is finished where the
        backward of that result's producer starts. Sources (constants) own no
        backward node: what the exporter ties to them belongs to their readers."""
        tg = self.tg
        home: dict[int, Cluster] = {}
        for c in root.walk():
            for n in c.nodes + c.attached:
                home[n] = c
        owner: dict[int, int] = {}
        loose = []
        for b in tg.backward:
            f = tg.graph.node(b).forward_node_id if tg.graph.node(b).HasField("forward_node_id") else None
            if f not in home or f in self.sources:  # a constant's backward is someone else's
                reads = [p for p in tg.node_inputs(b) if p in home and p not in self.sources]
                f = max(reads, key=self.position.__getitem__, default=None)
            if f is None:
                loose.append(b)
            else:
                owner[b] = f
        for b in reversed(loose):
            users = [u for u in tg.node_users[b] if u in owner]
            if users:
                owner[b] = owner[min(users, key=tg.position.__getitem__)]
        for b in loose:
            inputs = [p for p in tg.node_inputs(b) if p in owner and p not in home]
            if b not in owner and inputs:
                owner[b] = owner[max(inputs, key=tg.position.__getitem__)]
        self._untangle(root, home, owner)
        for b in tg.backward:
            f = owner.get(b)
            cluster = home[f] if f is not None else root
            cluster.backward.append(b)
            cluster.owner[b] = f

    def _untangle(self, root: Cluster, home: dict[int, Cluster], owner: dict[int, int]) -> None:
        """Make every level's backward order the reverse of its forward order.

        At each level, top down, the parts' backward runs in the reverse of their
        forward topological order. A backward node that reads the result of a
        backward node of a part running later moves to that part (it takes the
        other node's owner): the exporter's forward_node_id of a gradient sum
        names either summand's forward node, and sums cross parts where residual
        branches meet. Moves only go to later-running parts, so this ends."""
        tg = self.tg
        parent: dict[int, Cluster] = {}
        for c in root.walk():
            parent.update((k.id, c) for k in c.children)

        def part_in(cluster: Cluster, n: int):
            """The part of `cluster` holding forward node n (None: not inside)."""
            c = home[n]
            while c.id != cluster.id:
                if c.id not in parent:
                    return None
                if parent[c.id].id == cluster.id:
                    return ("c", c.id)
                c = parent[c.id]
            return ("n", n)

        levels = [root]
        while levels:
            cluster = levels.pop()
            levels.extend(cluster.children)
            members = cluster.forward_nodes()
            parts = {part_in(cluster, n) for n in members}
            graph = nx.DiGraph()
            graph.add_nodes_from(parts)
            for n in members:
                for i in tg.node_inputs(n):
                    if i in home and (p := part_in(cluster, i)) is not None and p != part_in(cluster, n):
                        graph.add_edge(p, part_in(cluster, n))
            first = {p: min(self.position[n] for n in members if part_in(cluster, n) == p) for p in parts}
            order = list(nx.lexicographical_topological_sort(graph, key=first.__getitem__))
            runs_at = {p: -i for i, p in enumerate(order)}   # backward runs the reverse
            for b in tg.backward:
                if owner.get(b) is None or (pb_ := part_in(cluster, owner[b])) is None:
                    continue
                for a in tg.node_inputs(b):
                    if owner.get(a) is None or a in home:
                        continue
                    pa = part_in(cluster, owner[a])
                    if pa is not None and runs_at[pa] > runs_at[pb_]:
                        owner[b], pb_ = owner[a], pa

    # --------------------------------------------------------------- signature

    def _signature(self, cluster: Cluster) -> str:
        """A digest of the cluster's ops, arguments, shapes and internal wiring.

        Costs are left out: profiled costs are timed in the order the step runs, so
        the same op on the same shapes differs from block to block (by 1.5x at the
        median in a GPT-2, up to 4x for views), and with them no two blocks matched.
        A copy's options are the recomputation choices made for the first; HiRemate
        measures them again on the copy's own costs (`hiremate._mapped`)."""
        g = self.tg.graph
        nodes = sorted(cluster.forward_nodes(), key=self.position.__getitem__)
        local = {n: i for i, n in enumerate(nodes)}
        digest = hashlib.sha1()
        for n in nodes:
            node = g.node(n)
            inputs = []
            for v in node.inputs:
                p = g.producer(v)
                inputs.append(f"#{local[p]}.{list(g.node(p).outputs).index(v)}" if p in local
                              else _value_shape(g.value(v)))
            outputs = [_value_shape(g.value(v)) for v in node.outputs]
            arguments = [_argument_text(a, node.inputs) for a in node.args]
            arguments += [f"{k.name}={_argument_text(k.value, node.inputs)}" for k in node.kwargs]
            digest.update(f"{node.op}|{arguments}|{inputs}|{outputs}\n".encode())
        digest.update(("children:" + ",".join(c.signature for c in cluster.children)).encode())
        return digest.hexdigest()[:16]


def _value_shape(v: pb.Value) -> str:
    return f"{v.dtype}{list(v.shape)}"


def _argument_text(arg: pb.Argument, inputs) -> str:
    """An argument with tensor references as input positions (ids differ between copies)."""
    kind = arg.WhichOneof("kind")
    if kind == "tensor":
        return f"in{list(inputs).index(arg.tensor)}"
    if kind == "list":
        return "[" + ",".join(_argument_text(a, inputs) for a in arg.list.items) + "]"
    return f"{kind}:{getattr(arg, kind)}"


# -------------------------------------------------------------------- the IR


def store_hierarchy(graph: Graph, tree: Partition) -> pb.Hierarchy:
    """Write the partition tree into the graph's hierarchy (replacing any before)."""
    hierarchy = graph.proto.hierarchy
    hierarchy.Clear()
    for c in tree.clusters():
        hierarchy.clusters.add(id=c.id, name=f"L{c.level}.{c.id}", level=c.level,
                               node_ids=c.nodes + c.attached + c.backward, children=[k.id for k in c.children],
                               signature=c.signature)
    hierarchy.root_id = tree.root.id
    return hierarchy
