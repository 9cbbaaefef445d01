"""Example graphs built by hand, for the demo, the docs and the tests.

`mlp` writes out, op by op, the joint forward+backward graph that lowering a
small MLP (addmm, relu, dropout, MSE loss) through torch.export gives, with
executable aten arguments, analytic costs and a per-layer hierarchy, so that
every part of the format is exercised before the PyTorch frontend exists.

    python -m remat_ir.ir.examples examples/mlp.rir   # regenerate the shipped file
"""

from __future__ import annotations

import sys

from . import remat_ir_pb2 as pb
from .arguments import TensorRef
from .graph import Graph
from .schedules import recompute_all, store_all

#: Rates of the analytic cost model (a modest accelerator), FLOP/s and byte/s.
FLOP_RATE, BYTE_RATE = 1e13, 1e12


def _cost(flops: float, moved_bytes: int) -> dict:
    return dict(time_s=max(flops / FLOP_RATE, moved_bytes / BYTE_RATE), flops=flops,
                cost_source="analytic")


def mlp(layers: int = 4, batch: int = 256, width: int = 128, dropout: float = 0.1) -> Graph:
    """Joint training graph of `layers` Linear layers with ReLU and dropout, MSE loss."""
    g = Graph(name=f"mlp{layers}x{width}")
    g.proto.provenance.frontend = "synthetic"
    g.proto.provenance.source_model = "remat_ir.ir.examples.mlp"
    act = (batch, width)
    act_bytes = batch * width * 4
    x = g.add_value("x", "float32", act, kind="user_input")
    target = g.add_value("target", "float32", act, kind="user_input")
    g.add_input(x)
    g.add_input(target)
    weights, biases = [], []
    for i in range(layers):
        weights.append(g.add_value(f"layers.{i}.weight", "float32", (width, width), kind="parameter"))
        biases.append(g.add_value(f"layers.{i}.bias", "float32", (width,), kind="parameter"))
        g.add_input(weights[-1])
        g.add_input(biases[-1])

    layer_nodes: list[list[int]] = []
    saved = []  # per layer: (layer input, relu output or None, dropout mask or None, addmm node, relu node, dropout node)
    a = x
    for i in range(layers):
        nodes = []
        wt = g.add_value(f"t_{i}", "float32", (width, width), alias_of=weights[i])
        nodes.append(g.add_node("aten.t.default", [weights[i]], [wt], phase="forward",
                                name=f"t_{i}", source=f"layers.{i}", **_cost(0, 0)))
        h = g.add_value(f"addmm_{i}", "float32", act)
        addmm = g.add_node("aten.addmm.default", [biases[i], a, wt], [h], phase="forward",
                           name=f"addmm_{i}", source=f"layers.{i}",
                           **_cost(2.0 * batch * width * width, 2 * act_bytes + width * width * 4))
        nodes.append(addmm)
        relu_out = mask = relu = drop = None
        out = h
        if i < layers - 1:
            relu_out = g.add_value(f"relu_{i}", "float32", act)
            relu = g.add_node("aten.relu.default", [h], [relu_out], phase="forward",
                              name=f"relu_{i}", source=f"act.{i}", **_cost(batch * width, 2 * act_bytes))
            out = relu_out
            nodes.append(relu)
            if dropout:
                drop_out = g.add_value(f"dropout_{i}", "float32", act)
                mask = g.add_value(f"dropout_mask_{i}", "bool", act)
                drop = g.add_node("aten.native_dropout.default", [relu_out], [drop_out, mask],
                                  phase="forward", name=f"dropout_{i}", source=f"drop.{i}",
                                  args=[TensorRef(relu_out), dropout, True], random=True,
                                  **_cost(2 * batch * width, 2 * act_bytes + act_bytes // 4))
                out = drop_out
                nodes.append(drop)
        saved.append((a, relu_out, mask, addmm, relu, drop))
        layer_nodes.append(nodes)
        a = out

    loss = g.add_value("loss", "float32", (), kind="output")
    mse = g.add_node("aten.mse_loss.default", [a, target], [loss], phase="forward", name="mse_loss",
                     source="loss", args=[TensorRef(a), TensorRef(target), 1],
                     **_cost(3 * batch * width, 2 * act_bytes))
    g.add_output(loss, "user_output", "loss")

    grad_loss = g.add_value("tangent_loss", "float32", (), kind="gradient")
    g.add_input(grad_loss, gradient_of=loss)
    grad = g.add_value("grad_out", "float32", act, kind="gradient")
    g.add_node("aten.mse_loss_backward.default", [grad_loss, a, target], [grad], phase="backward",
               name="mse_loss_backward", source="loss", forward_node_id=mse,
               args=[TensorRef(grad_loss), TensorRef(a), TensorRef(target), 1],
               **_cost(3 * batch * width, 3 * act_bytes))
    for i in reversed(range(layers)):
        a_in, relu_out, mask, addmm, relu, drop = saved[i]
        nodes = layer_nodes[i]
        if drop is not None:
            g_relu = g.add_value(f"grad_dropout_{i}", "float32", act, kind="gradient")
            nodes.append(g.add_node("aten.native_dropout_backward.default", [grad, mask], [g_relu],
                                    phase="backward", name=f"dropout_backward_{i}", source=f"drop.{i}",
                                    args=[TensorRef(grad), TensorRef(mask), 1.0 / (1.0 - dropout)],
                                    forward_node_id=drop, **_cost(batch * width, 3 * act_bytes)))
            grad = g_relu
        if relu is not None:
            g_h = g.add_value(f"grad_relu_{i}", "float32", act, kind="gradient")
            nodes.append(g.add_node("aten.threshold_backward.default", [grad, relu_out], [g_h],
                                    phase="backward", name=f"relu_backward_{i}", source=f"act.{i}",
                                    args=[TensorRef(grad), TensorRef(relu_out), 0.0],
                                    forward_node_id=relu, **_cost(batch * width, 3 * act_bytes)))
            grad = g_h
        g_t = g.add_value(f"grad_t_{i}", "float32", (width, batch), kind="gradient", alias_of=grad)
        nodes.append(g.add_node("aten.t.default", [grad], [g_t], phase="backward",
                                name=f"grad_t_{i}", source=f"layers.{i}", forward_node_id=addmm,
                                **_cost(0, 0)))
        g_w = g.add_value(f"grad_weight_{i}", "float32", (width, width), kind="gradient")
        nodes.append(g.add_node("aten.mm.default", [g_t, a_in], [g_w], phase="backward",
                                name=f"grad_weight_{i}", source=f"layers.{i}", forward_node_id=addmm,
                                **_cost(2.0 * batch * width * width, 2 * act_bytes + width * width * 4)))
        g_b = g.add_value(f"grad_bias_{i}", "float32", (width,), kind="gradient")
        nodes.append(g.add_node("aten.sum.dim_IntList", [grad], [g_b], phase="backward",
                                name=f"grad_bias_{i}", source=f"layers.{i}", forward_node_id=addmm,
                                args=[TensorRef(grad), [0]], **_cost(batch * width, act_bytes)))
        g.add_output(g_w, "parameter_gradient", f"layers.{i}.weight")
        g.add_output(g_b, "parameter_gradient", f"layers.{i}.bias")
        if i > 0:
            g_a = g.add_value(f"grad_input_{i}", "float32", act, kind="gradient")
            nodes.append(g.add_node("aten.mm.default", [grad, weights[i]], [g_a], phase="backward",
                                    name=f"grad_input_{i}", source=f"layers.{i}", forward_node_id=addmm,
                                    **_cost(2.0 * batch * width * width,
                                            2 * act_bytes + width * width * 4)))
            grad = g_a

    hierarchy = g.proto.hierarchy
    for i, nodes in enumerate(layer_nodes):
        hierarchy.clusters.add(id=i, name=f"layers.{i}", level=0, node_ids=nodes,
                               signature="hidden" if i < layers - 1 else "last")
    loose = [n for n in g.nodes if not any(n in c for c in layer_nodes)]
    hierarchy.clusters.add(id=layers, name="model", level=1, node_ids=loose, children=range(layers))
    hierarchy.root_id = layers
    g.add_schedule(store_all(g))
    g.add_schedule(recompute_all(g))
    return g


def main(argv: list[str]) -> int:
    from .serialization import save
    if len(argv) != 1:
        print("usage: python -m remat_ir.ir.examples OUTPUT(.rir|.json)", file=sys.stderr)
        return 2
    print(f"wrote {save(mlp(), argv[0])}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
