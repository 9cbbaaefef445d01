"""Small graphs whose memory behaviour can be worked out by hand."""

from __future__ import annotations

from remat_ir.ir import Graph, pb


def chain(n: int, elements: int = 250, f_time: float = 1.0, b_time: float = 2.0,
          workspace: dict[int, int] | None = None) -> tuple[Graph, dict]:
    """Chain x -> a1 -> ... -> an (an is the output); backward b_n .. b_1.

    b_i reads the gradient g_i and the forward value a_{i-1} and makes
    g_{i-1}; g_n is the output gradient fed in (resident), g_0 the input
    gradient (a graph output). Every tensor has `elements` float32 elements
    (4 * elements bytes). Returns the graph and the ids by name.
    """
    g = Graph(name=f"chain{n}")
    ids: dict = {}
    shape = (elements,)
    ids["a0"] = g.add_value("x", "float32", shape, kind="user_input")
    g.add_input(ids["a0"])
    for i in range(1, n + 1):
        ids[f"a{i}"] = g.add_value(f"a{i}", "float32", shape, kind="output" if i == n else "activation")
        ids[f"f{i}"] = g.add_node("test.f", [ids[f"a{i-1}"]], [ids[f"a{i}"]], phase="forward",
                                  time_s=f_time, workspace_bytes=(workspace or {}).get(i, 0))
    g.add_output(ids[f"a{n}"], "user_output", "out")
    ids[f"g{n}"] = g.add_value(f"g{n}", "float32", shape, kind="gradient")
    g.add_input(ids[f"g{n}"], gradient_of=ids[f"a{n}"])
    for i in range(n, 0, -1):
        ids[f"g{i-1}"] = g.add_value(f"g{i-1}", "float32", shape, kind="gradient")
        ids[f"b{i}"] = g.add_node("test.b", [ids[f"g{i}"], ids[f"a{i-1}"]], [ids[f"g{i-1}"]],
                                  phase="backward", time_s=b_time, forward_node_id=ids[f"f{i}"])
    g.add_output(ids["g0"], "input_gradient", "x")
    return g, ids


def schedule(steps: list[tuple[str, int]], backward_start: int, name: str = "hand", **fields) -> pb.Schedule:
    """A schedule from ("compute", node) / ("free", value) pairs."""
    s = pb.Schedule(name=name, backward_start=backward_start, **fields)
    for action, target in steps:
        s.steps.add(**{action: target})
    return s


def user_output(g: Graph, reads: list[int], name: str = "out") -> tuple[int, int]:
    """A forward node reading `reads` whose one (4-byte) result is the user output, and the
    output's gradient fed in: (output value, tangent value)."""
    out = g.add_value(name, "float32", (1,), kind="output")
    g.add_node("test.op", reads, [out], phase="forward", time_s=1)
    g.add_output(out, "user_output", name)
    tangent = g.add_value("tangent", "float32", (1,), kind="gradient")
    g.add_input(tangent, gradient_of=out)
    return out, tangent
