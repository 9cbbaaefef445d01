"""The ONNX frontend: ONNX models lower into the IR and train through the PyTorch runtime.

- GPT-2 and a CNN exported with `torch.onnx.export(..., dynamo=True)` train 3 steps
  through `remat_onnx` at 50% of the store-everything peak: losses and every gradient
  equal the original torch model's (relative error < 1e-5), and the forward output
  equals onnxruntime's. BERT and a ResNet (transformers configs) lower and train a step
  with every activation recomputed: gradients equal the imported module's eager autograd.
- Hand-built graphs cover what exporters emit around the big ops: omitted optional
  inputs (Clip without min), opset-17 LayerNormalization, int64 index inputs,
  Constant/ConstantOfShape/Shape-built reshapes; each is checked against onnxruntime
  and a torch expression written out by hand.
- The model-zoo graphs shipped in the `onnx` package lower and are planned at 50%;
  with random weights, their outputs equal onnxruntime's and a training step equals
  eager autograd.
- Bad input gets one clear error: every unsupported op with its nodes, before any
  work; dynamic dimensions without example inputs name the inputs.
"""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import onnx_models as om
import remat_ir
from remat_ir import ir
from remat_ir.api import scheduled_onnx_module
from remat_ir.frontends import onnx as onnx_frontend
from remat_ir.frontends.onnx import OnnxInputError, UnsupportedOps
from remat_ir.frontends.torch import LoweringError
from remat_ir.ir import RematIRError
from remat_ir.lowering import lower_onnx, lower_onnx_module
from remat_ir.solvers import InfeasibleBudget, solve
from slow import some_slow

ort = pytest.importorskip("onnxruntime")


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    scale = max(a.abs().max().item(), b.abs().max().item(), 1e-30)
    return (a - b).abs().max().item() / scale


def run_ort(model, inputs: tuple) -> list[np.ndarray]:
    data = model if isinstance(model, str) else model.SerializeToString()
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: t.detach().numpy() for i, t in zip(session.get_inputs(), inputs)})


def as_tuple(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Each torch model exported once: name -> (path, model, args, loss_of)."""
    folder = tmp_path_factory.mktemp("onnx")
    cache = {}

    def get(name):
        if name not in cache:
            model, args, dynamic, loss_of = om.TORCH_MODELS[name]()
            path = om.export(model, args, dynamic, str(folder / f"{name}.onnx"))
            cache[name] = path, model, args, loss_of
        return cache[name]
    return get


def torch_counterparts(onnx_module, torch_model) -> dict:
    """ONNX parameter -> (torch parameter name, transposed?), matched by value.

    The exporter names initializers after the torch parameters but may fold a
    transpose into a new one (`val_374` = lm_head.weight.T): values decide.
    """
    torch_params = dict(torch_model.named_parameters())
    found = {}
    for name, p in onnx_module.named_parameters():
        hits = [(n, False) for n, t in torch_params.items() if t.shape == p.shape and torch.equal(t, p)]
        hits += [(n, True) for n, t in torch_params.items()
                 if t.dim() == 2 and t.t().shape == p.shape and torch.equal(t.t(), p)]
        assert len(hits) == 1, f"ONNX parameter {name!r} matches {hits} in the torch model"
        found[name] = hits[0]
    assert sorted(n for n, _ in found.values()) == sorted(torch_params), "every torch parameter is trained"
    return found


# ---------------------------------------------------------------- acceptance: GPT-2 and a CNN

@pytest.mark.parametrize("name", some_slow(["gpt2", "cnn"], ["gpt2"]))  # GPT-2's ONNX: test-all
def test_exported_model_trains_like_torch_at_half_memory(exported, name):
    path, model, args, loss_of = exported(name)
    (reference,) = run_ort(path, args)
    # The CNN's MILP does not prove optimality quickly; the best plan found in 5 s is used.
    scheduled = remat_ir.remat_onnx(path, args, budget="50%", cost_model="flops", time_limit_s=5)
    graph, schedule = scheduled.graph, scheduled.schedule
    assert schedule.solver == "hiremate"
    assert schedule.budget_bytes == ir.store_all(graph).predicted_peak_bytes // 2
    result = ir.simulate(graph, schedule)
    assert result.peak_bytes <= schedule.budget_bytes and result.recomputations > 0

    with torch.no_grad():
        assert relative_error(scheduled.eval()(*args), torch.from_numpy(reference)) < 1e-5
    scheduled.train()
    counterparts = torch_counterparts(scheduled, model)
    torch_params = dict(model.named_parameters())
    opt_torch = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt_onnx = torch.optim.SGD(scheduled.parameters(), lr=0.05, momentum=0.9)
    errors = {}
    for step in range(3):
        loss_torch = loss_of(model(*args))
        loss_torch.backward()
        out = scheduled(*args)
        assert isinstance(out, torch.Tensor)  # one graph output: the tensor, not a tuple
        loss_onnx = loss_of(out)
        loss_onnx.backward()
        errors[f"step {step} loss"] = relative_error(loss_torch, loss_onnx)
        for pname, p in scheduled.named_parameters():
            tname, transposed = counterparts[pname]
            g = torch_params[tname].grad
            errors[f"step {step} grad {pname}"] = relative_error(g.t() if transposed else g, p.grad)
        opt_torch.step(), opt_onnx.step()
        opt_torch.zero_grad(), opt_onnx.zero_grad()
    worst = max(errors, key=errors.get)
    assert errors[worst] < 1e-5, f"{worst}: relative error {errors[worst]:.3g}"


@pytest.mark.parametrize("mode", some_slow(["nearest", "bilinear", "bicubic"], ["bilinear", "bicubic"]))
def test_exported_unets_upsampling_with_resize_train_like_torch(exported, mode):
    """`F.interpolate` exports as Resize, which was refused as unsupported: a U-Net's
    upsampling in each mode trains 2 steps at 85% with losses and gradients within 1e-5 of
    the torch model's."""
    path, model, args, loss_of = exported(f"unet_{mode}")
    assert "Resize" in {n.op_type for n in onnx.load(path).graph.node}
    scheduled = remat_ir.remat_onnx(path, args, budget="85%", cost_model="flops")
    assert ir.simulate(scheduled.graph, scheduled.schedule).peak_bytes <= scheduled.schedule.budget_bytes
    counterparts = torch_counterparts(scheduled, model)
    torch_params = dict(model.named_parameters())
    opt_torch = torch.optim.SGD(model.parameters(), lr=0.05)
    opt_onnx = torch.optim.SGD(scheduled.parameters(), lr=0.05)
    for step in range(2):
        loss_torch, loss_onnx = loss_of(model(*args)), loss_of(scheduled(*args))
        loss_torch.backward(), loss_onnx.backward()
        assert relative_error(loss_torch, loss_onnx) < 1e-5, step
        for pname, p in scheduled.named_parameters():
            assert relative_error(torch_params[counterparts[pname][0]].grad, p.grad) < 1e-5, (step, pname)
        opt_torch.step(), opt_onnx.step()
        opt_torch.zero_grad(), opt_onnx.zero_grad()


def test_exported_buffers_stay_constants(exported):
    """Every float initializer a differentiable input reads was trained: buffers (a causal
    mask, a scale) got gradients, and Adam moved them, drifting from the torch model (found
    by a review). Those PyTorch's exporter marks as buffers stay constants: the parameters
    are the torch model's (its Linear weights as the exporter folded them, transposed),
    and 3 Adam steps train like it."""
    path, model, args, loss_of = exported("masked_attention")
    module, _ = onnx_frontend.to_torch(path, args)
    counterparts = torch_counterparts(module, model)   # one torch parameter each, all of them
    assert len(counterparts) == len(list(model.parameters()))
    assert {"mask", "scale"} <= set(module.onnx_names.values()) - {module.onnx_names[n] for n in counterparts}
    torch_params = dict(model.named_parameters())
    scheduled = remat_ir.remat_onnx(path, args, solver="recompute-all", cost_model="flops")
    opt_torch = torch.optim.Adam(model.parameters(), lr=1e-2)
    opt_onnx = torch.optim.Adam(scheduled.parameters(), lr=1e-2)
    for step in range(3):
        loss_torch, loss_onnx = loss_of(model(*args)), loss_of(scheduled(*args))
        loss_torch.backward(), loss_onnx.backward()
        assert relative_error(loss_torch, loss_onnx) < 1e-5, step
        for pname, p in scheduled.named_parameters():
            tname, transposed = counterparts[pname]
            g = torch_params[tname].grad
            assert relative_error(g.t() if transposed else g, p.grad) < 1e-5, (step, pname)
        opt_torch.step(), opt_onnx.step()
        opt_torch.zero_grad(), opt_onnx.zero_grad()


def eager_and_scheduled_step(module, scheduled, args, loss_of) -> float:
    """Worst relative error between one step of the imported module run eagerly and scheduled."""
    eager = copy.deepcopy(module)
    loss_e = loss_of(as_tuple(eager(*args)))
    loss_e.backward()
    loss_s = loss_of(as_tuple(scheduled(*args)))
    loss_s.backward()
    assert torch.isfinite(loss_s)
    worst = relative_error(loss_e, loss_s)
    grads = dict(eager.named_parameters())
    for name, p in scheduled.named_parameters():
        assert p.grad is not None, f"{name} got no gradient"
        worst = max(worst, relative_error(grads[name].grad, p.grad))
    return worst


@pytest.mark.parametrize("name", ["bert", "resnet"])
def test_bert_and_resnet_lower_solve_and_train(exported, name):
    """BERT (two outputs, an int64 attention mask) and transformers' ResNet (its BatchNorm
    folded into the convolutions by the exporter, the loss inside the graph)."""
    path, model, args, _ = exported(name)
    module, examples = onnx_frontend.to_torch(path, args)
    with torch.no_grad():
        ours = as_tuple(module(*args))
        theirs = as_tuple(model(*args))
    for o, r, t in zip(ours, run_ort(path, args), theirs):
        assert relative_error(o, torch.from_numpy(r)) < 1e-5
        assert relative_error(o, t) < 1e-5
    graph = lower_onnx_module(module, examples, cost_model="flops")
    # At these CI sizes half the peak is below what any plan reaches (BERT: hiremate takes a
    # minute at seq 64; the tiny ResNet's peak is its parameter gradients): recompute all.
    schedule = remat_ir.plan(graph, solver="recompute-all")
    assert ir.simulate(graph, schedule).recomputations > 0
    scheduled = scheduled_onnx_module(module, graph, schedule)

    def loss_of(outs):
        return sum(o.float().pow(2).mean() for o in outs)
    assert eager_and_scheduled_step(module, scheduled, args, loss_of) < 1e-5


class _ConvNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.head = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.head(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


def test_an_inference_norm_whose_statistics_are_trained_initializers_trains_like_its_module():
    """Found by hunt68: torch's legacy exporter reads equal initializers once, so a fresh
    norm's running variance is `Identity(bn.weight)` and its mean `Identity(bn.bias)`;
    onnx.checker and onnxruntime take the model, remat-ir refused it with torch's "not
    differentiable with respect to argument 'running_mean'", blaming the user."""
    import io

    torch.manual_seed(0)
    net, x, buffer = _ConvNorm().eval(), torch.randn(4, 3, 8, 8), io.BytesIO()
    torch.onnx.export(net, (x,), buffer, dynamo=False, opset_version=17, do_constant_folding=False)
    model = onnx.load_from_string(buffer.getvalue())
    assert ("bn.weight", "bn.running_var") in [(n.input[0], n.output[0]) for n in model.graph.node
                                               if n.op_type == "Identity"]
    module, examples = onnx_frontend.to_torch(model, (x,))
    with torch.no_grad():
        assert relative_error(module(x), torch.from_numpy(run_ort(model, (x,))[0])) < 1e-5
    graph = lower_onnx_module(module, examples, cost_model="flops")
    scheduled = scheduled_onnx_module(module, graph, remat_ir.plan(graph, solver="recompute-all"))
    assert eager_and_scheduled_step(module, scheduled, (x,), lambda outs: outs[0].square().mean()) == 0


def _matmul_graph(nodes, initializers):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _weight(name: str, seed: int) -> TensorProto:
    return numpy_helper.from_array(np.random.RandomState(seed).randn(8, 8).astype(np.float32), name)


def _external_weight() -> TensorProto:
    weight = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[8, 8], data_location=TensorProto.EXTERNAL)
    entry = weight.external_data.add()
    entry.key, entry.value = "location", "weights.bin"
    return weight


def _short_weight() -> TensorProto:
    weight = _weight("W", 0)
    weight.raw_data = weight.raw_data[:100]
    return weight


@pytest.mark.parametrize("model, said", [
    (lambda: _matmul_graph([helper.make_node("MatMul", ["x", "W"], ["a"]), helper.make_node("MatMul", ["x", "V"], ["a"]),
                            helper.make_node("Tanh", ["a"], ["y"])], [_weight("W", 0), _weight("V", 1)]),
     r"g: tensor 'a' is made by node '<MatMul #1>' \(MatMul\) and by node '<MatMul #0>' \(MatMul\); an ONNX "
     r"graph makes each tensor once"),
    (lambda: _matmul_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], [_short_weight()]),
     r"tensor 'W' \(shape \[8, 8\]\): its data cannot be read \(cannot reshape array of size 25"),
    (lambda: _matmul_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], [_external_weight()]),
     r"tensor 'W' \(shape \[8, 8\]\): its data cannot be read \(Data of TensorProto .* should be stored in "
     r"weights.bin.*\): its data is in a separate file, so pass the model's path"),
])
def test_a_malformed_onnx_graph_is_one_error_naming_the_tensor(model, said):
    """Found by hunt68: a tensor made by two nodes (which onnx.checker and onnxruntime
    refuse) was imported taking the later one, and trained (the earlier one's weight got no
    gradient, silently); an initializer's data too short for its shape, or external data
    missing from a model given in memory, raised NumPy's or onnx's own error."""
    with pytest.raises(LoweringError, match=said):
        remat_ir.remat_onnx(model(), (torch.randn(4, 8),), cost_model="flops")


# ---------------------------------------------------------------- the module's interface

def test_parameters_are_the_float_initializers_by_name(exported):
    path, model, args, _ = exported("gpt2")
    module, _ = onnx_frontend.to_torch(path, args)
    proto = onnx.load(path)
    float_inits = {i.name for i in proto.graph.initializer if i.data_type == TensorProto.FLOAT and i.dims}
    params = dict(module.named_parameters())
    assert set(params) == float_inits  # MatMul/Gemm weights, LayerNorm scales and biases, embeddings
    assert "gpt.transformer.h.0.attn.c_attn.weight" in params  # dotted names: nested modules
    assert module.get_parameter("gpt.transformer.h.1.mlp.c_fc.bias") is params["gpt.transformer.h.1.mlp.c_fc.bias"]
    int_inits = {i.name for i in proto.graph.initializer if i.data_type == TensorProto.INT64}
    assert not int_inits & set(params) and not int_inits & set(module.state_dict())
    assert set(module.state_dict()) == float_inits  # constants are not persistent


def test_inputs_by_position_or_name_and_outputs(exported):
    path, model, args, _ = exported("bert")
    ids, mask = args
    module, _ = onnx_frontend.to_torch(path, {"input_ids": ids, "attention_mask": mask})
    scheduled = remat_ir.remat_onnx(path, args, solver="autograd", cost_model="flops")
    by_position = scheduled(ids, mask)
    by_name = scheduled(attention_mask=mask, input_ids=ids)
    assert isinstance(by_position, tuple) and len(by_position) == 2
    for a, b in zip(by_position, by_name):
        assert torch.equal(a, b)
    with pytest.raises(OnnxInputError, match="unknown \\['mask'\\].*missing \\['attention_mask'\\]"):
        scheduled(ids, mask=mask)
    with pytest.raises(ir.RematIRError, match="lowered for"):
        scheduled(ids[:, :8], mask[:, :8])


def test_ir_nodes_keep_their_onnx_node_names(exported):
    path, _, args, _ = exported("gpt2")
    graph = lower_onnx(path, args, cost_model="flops")
    proto = onnx.load(path)
    labels = {f"{n.name} ({n.op_type})" for n in proto.graph.node}
    forward = [n for n in graph.proto.nodes if n.phase == ir.pb.FORWARD]
    backward = [n for n in graph.proto.nodes if n.phase == ir.pb.BACKWARD]
    assert all(n.source in labels for n in forward), [n.source for n in forward if n.source not in labels]
    # Backward nodes too, but for the adds that sum the gradients of a value read twice.
    unnamed = [n for n in backward if n.source not in labels]
    assert all(n.op == "aten.add.Tensor" and not n.source for n in unnamed)
    assert len(unnamed) < len(backward) / 5
    assert any(n.source.endswith("(LayerNormalization)") for n in backward)
    assert graph.proto.provenance.frontend == "onnx"
    assert json.loads(graph.proto.metadata["onnx.input_names"]) == ["input_ids"]


# ---------------------------------------------------------------- hand-built graphs

def _edge_case_model(opset: int = 17):
    """Clip with min omitted (''), LayerNormalization (opset 17), a Gather by an int64 graph
    input, a reshape to a shape built from Shape/Gather/Constant/Concat, ConstantOfShape."""
    X = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])
    I = helper.make_tensor_value_info("idx", TensorProto.INT64, ["batch"])
    Y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(6, 8)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(size=(8,)).astype(np.float32), "b"),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, (8,)).astype(np.float32), "ln.scale"),
             numpy_helper.from_array(rng.normal(size=(8,)).astype(np.float32), "ln.bias"),
             numpy_helper.from_array(rng.normal(size=(5, 8)).astype(np.float32), "table"),
             numpy_helper.from_array(np.array(0.75, np.float32), "clip_max"),
             numpy_helper.from_array(np.array([0], np.int64), "zero")]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["mm"], name="matmul"),
        helper.make_node("Add", ["mm", "b"], ["biased"], name="add_bias"),
        helper.make_node("Clip", ["biased", "", "clip_max"], ["clipped"], name="clip_max_only"),
        helper.make_node("LayerNormalization", ["clipped", "ln.scale", "ln.bias"], ["normed"],
                         name="layer_norm", axis=-1, epsilon=1e-5),
        helper.make_node("Gather", ["table", "idx"], ["rows"], name="gather_rows", axis=0),
        helper.make_node("Mul", ["normed", "rows"], ["mixed"], name="mix"),
        helper.make_node("Shape", ["mixed"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], name="batch_size", axis=0),
        helper.make_node("Constant", [], ["split_dims"], name="dims",
                         value=numpy_helper.from_array(np.array([2, 4], np.int64))),
        helper.make_node("Concat", ["batch", "split_dims"], ["new_shape"], name="concat_shape", axis=0),
        helper.make_node("Reshape", ["mixed", "new_shape"], ["reshaped"], name="reshape"),
        helper.make_node("ConstantOfShape", ["new_shape"], ["halves"], name="halves",
                         value=numpy_helper.from_array(np.array([0.5], np.float32))),
        helper.make_node("Mul", ["reshaped", "halves"], ["scaled"], name="scale"),
        helper.make_node("ReduceSum", ["scaled", "zero"], ["y"], name="sum_batch", keepdims=0),
    ]
    graph = helper.make_graph(nodes, "edge_cases", [X, I], [Y], inits)
    # IR version 10 (onnx 1.16): what onnxruntime reads; helper would write the newest.
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _edge_case_reference(params: dict, x, idx):
    h = torch.clamp(x @ params["w"] + params["b"], max=0.75)
    h = torch.nn.functional.layer_norm(h, (8,), params["ln.scale"], params["ln.bias"], 1e-5)
    h = (h * params["table"][idx]).reshape(x.shape[0], 2, 4) * 0.5
    return h.sum(0)


def test_optional_inputs_layer_norm_int64_indices_and_built_shapes():
    model = _edge_case_model()
    onnx.checker.check_model(model)
    x, idx = torch.randn(3, 6), torch.tensor([4, 0, 2])
    module, _ = onnx_frontend.to_torch(model, (x, idx))
    (reference,) = run_ort(model, (x, idx))
    params = dict(module.named_parameters())
    assert set(params) == {"w", "b", "ln.scale", "ln.bias", "table"}  # not the scalar clip_max
    with torch.no_grad():
        assert relative_error(module(x, idx), torch.from_numpy(reference)) < 1e-6
    by_hand = {k: v.detach().clone().requires_grad_() for k, v in params.items()}
    _edge_case_reference(by_hand, x, idx).pow(2).sum().backward()
    scheduled = remat_ir.remat_onnx(model, {"x": x, "idx": idx}, solver="recompute-all",
                                    cost_model="flops")
    scheduled(x, idx=idx).pow(2).sum().backward()
    for name, p in scheduled.named_parameters():
        assert relative_error(by_hand[name].grad, p.grad) < 1e-5, name


def test_opset_9_graph_is_converted_and_opset_22_refused():
    model = _edge_case_model(opset=17)
    old = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Unsqueeze", ["r"], ["y"], axes=[0])],
        "old", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
        opset_imports=[helper.make_opsetid("", 9)])
    module, (x,) = onnx_frontend.to_torch(old)  # static shapes: inputs are generated
    assert module(x).shape == (1, 2, 3) and module.onnx_opset == 13
    model.opset_import[0].version = 22
    with pytest.raises(LoweringError, match="opset 22 is newer .*opsets 13 to 21"):
        onnx_frontend.to_torch(model, (torch.randn(3, 6), torch.tensor([0, 1, 2])))


# ---------------------------------------------------------------- errors

def test_every_unsupported_op_is_named_in_one_error_before_any_work():
    X = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    Y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("Col2Im", ["a"], ["b"], name="col2im_1"),
             helper.make_node("Col2Im", ["b"], ["c"], name="col2im_2"),
             helper.make_node("FusedGemm", ["c"], ["d"], name="fused", domain="com.microsoft"),
             helper.make_node("Unique", ["d"], ["y"], name="unique")]
    model = helper.make_model(helper.make_graph(nodes, "bad", [X], [Y]),
                              opset_imports=[helper.make_opsetid("", 18),
                                             helper.make_opsetid("com.microsoft", 1)])
    # No example inputs for a dynamic batch either: the op check comes first.
    with pytest.raises(UnsupportedOps) as info:
        lower_onnx(model)
    message = str(info.value)
    assert "\n" not in message
    assert info.value.ops == {"Col2Im": ["col2im_1", "col2im_2"], "com.microsoft.FusedGemm": ["fused"],
                              "Unique": ["unique"]}
    for text in ("3 op types", "Col2Im (nodes 'col2im_1', 'col2im_2')",
                 "com.microsoft.FusedGemm (node 'fused')", "Unique (node 'unique')"):
        assert text in message


def test_inputs_of_other_shapes_than_imported_are_named_wherever_the_graph_runs():
    """The import folds Shape -> Gather -> Concat -> Reshape for the example inputs, so a
    batch of 4 through a graph imported at 2 reshaped with the example's batch: outputs
    0.5 off onnxruntime's in eval mode, under no_grad and from `to_torch`'s module,
    silently (found by a review). Each now names the input; a training call says to
    import again with remat_onnx (it said remat)."""
    X = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 6])
    Y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
             helper.make_node("Concat", ["batch", "rest"], ["target"], axis=0),
             helper.make_node("Mul", ["x", "w"], ["xw"]),
             helper.make_node("Reshape", ["xw", "target"], ["r"]),
             helper.make_node("Tanh", ["r"], ["y"])]
    inits = [numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([-1, 2], np.int64), "rest"),
             numpy_helper.from_array(_f(4, 6), "w")]
    model = helper.make_model(helper.make_graph(nodes, "reshaped", [X], [Y], inits),
                              opset_imports=[helper.make_opsetid("", 18)])
    imported, given = torch.randn(2, 4, 6), torch.randn(4, 4, 6)
    said = r"input 'x' is a torch.float32 tensor of shape \[4, 4, 6\], but the ONNX graph was imported for " \
           r"torch.float32 of shape \[2, 4, 6\].* Import it again"
    module, _ = onnx_frontend.to_torch(model, (imported,))
    with pytest.raises(OnnxInputError, match=said):
        module(given)
    with pytest.raises(OnnxInputError, match=r"input 'x' is a torch.int64 tensor of shape \[2, 4, 6\]"):
        module(imported.long())
    scheduled = remat_ir.remat_onnx(model, (imported,), solver="recompute-all", cost_model="flops")
    with torch.no_grad(), pytest.raises(OnnxInputError, match=said):
        scheduled(given)
    with pytest.raises(OnnxInputError, match=said):
        scheduled.eval()(given)
    with pytest.raises(RematIRError, match=r"call remat_ir.remat_onnx with inputs like these"):
        scheduled.train()(given)
    assert relative_error(scheduled(imported), torch.from_numpy(run_ort(model, (imported,))[0])) < 1e-6


def test_a_string_input_is_named():
    """A graph input of strings ended in a traceback from the dtype table."""
    X = helper.make_tensor_value_info("words", TensorProto.STRING, [2])
    Y = helper.make_tensor_value_info("y", TensorProto.STRING, [2])
    model = helper.make_model(helper.make_graph([helper.make_node("Identity", ["words"], ["y"])],
                                                "strings", [X], [Y]),
                              opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(LoweringError, match=r"graph input 'words': element type STRING has no torch "
                                            r"equivalent; .*preprocess strings outside the model"):
        lower_onnx(model)


def test_dynamic_dimensions_without_example_inputs_name_the_inputs(exported):
    path, *_ = exported("bert")
    with pytest.raises(LoweringError) as info:
        onnx_frontend.to_torch(path)
    message = str(info.value)
    assert "'input_ids' ['batch', 'sequence']" in message and "'attention_mask'" in message
    assert "example_inputs" in message and "\n" not in message
    with pytest.raises(LoweringError, match="'input_ids' is torch.int32, but the graph declares torch.int64"):
        onnx_frontend.to_torch(path, (torch.zeros(2, 4, dtype=torch.int32), torch.ones(2, 4, dtype=torch.int64)))


def test_shape_inputs_computed_at_runtime_are_refused_with_the_node_name():
    X = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])
    S = helper.make_tensor_value_info("s", TensorProto.INT64, [2])
    nodes = [helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape_by_input")]
    model = helper.make_model(helper.make_graph(
        nodes, "dyn", [X, S], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
        opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(LoweringError, match="node 'reshape_by_input' \\(Reshape\\): input 1 's' sets a shape, "
                                            "axis or size.* depends on the graph's inputs: make it an "
                                            "initializer or a Constant node"):
        onnx_frontend.to_torch(model)
    # Dropout's training mode given as a graph input (as training exports do) was said to
    # be a shape, axis or size (found by a review).
    T = helper.make_tensor_value_info("t", TensorProto.BOOL, [])
    nodes = [helper.make_node("Dropout", ["x", "", "t"], ["y"], name="dropout_by_input")]
    model = helper.make_model(helper.make_graph(
        nodes, "dyn", [X, T], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
        opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(LoweringError, match="node 'dropout_by_input' \\(Dropout\\): input 2 't' sets its "
                                            "ratio or training mode"):
        onnx_frontend.to_torch(model)


# ---------------------------------------------------------------- the command line

def test_convert_then_solve_on_the_command_line(exported, tmp_path):
    path, *_ = exported("gpt2")
    command = [sys.executable, "-m", "remat_ir"]
    rir = tmp_path / "gpt2.rir"
    done = subprocess.run(command + ["convert", path, "--shape", "input_ids=4x64", "--cost-model", "flops",
                                     "-o", str(rir)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "schedules autograd" in done.stdout
    planned = tmp_path / "planned.rir"
    done = subprocess.run(command + ["solve", str(rir), "--budget", "50%", "--solver", "rotor",
                                     "-o", str(planned)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    graph = ir.load(planned)
    assert graph.proto.provenance.frontend == "onnx"
    schedule = graph.proto.schedules[-1]
    assert ir.simulate(graph, schedule).peak_bytes <= schedule.budget_bytes
    done = subprocess.run(command + ["convert", path, "-o", str(tmp_path / "x.rir")],
                          capture_output=True, text=True)
    assert done.returncode == 2
    error = done.stderr.strip().splitlines()[-1]  # after the progress line, one line
    assert error.startswith("remat-ir: error:") and "Traceback" not in done.stderr
    assert "--shape" in error and "input_ids" in error


# ---------------------------------------------------------------- the model zoo in the onnx package

ZOO = om.zoo_paths()
#: Planned at 50% (rebatched to 64, or ZOO_BATCH). hiremate plans densenet121 and inception_v2
#: at 50% too, in 34 s and 24 s on two cores (README); CI plans them with sqrt, in under a second.
ZOO_AT_HALF = {"inception_v1": "hiremate", "resnet50": "hiremate", "shufflenet": "hiremate",
               "squeezenet": "hiremate", "densenet121": "sqrt", "inception_v2": "sqrt",
               "vgg19": "hiremate"}
#: Least peaks (hiremate's smallest feasible, through Checkmate's min-peak MILP) fall with the
#: batch as full-resolution activations outweigh the weight gradients: vgg19 76% of
#: store-everything at batch 8, 55% at 64, 50.05% at 512, 49.6% at 1024; bvlc_alexnet 59.7%
#: at 64, 50.7% at 256, below half at 512 (planned at 48.8%).
ZOO_BATCH = {"vgg19": 1024, "bvlc_alexnet": 512}
#: Not at 50% at any batch: zfnet512's first layer (96 channels at 110x110) makes one
#: tensor 12% of the store-everything peak, and the backward of its local response
#: normalization holds about five such tensors at once (its input, its output's gradient, the
#: denominators, and the window sums' two). Least peaks: 67.1% at batch 64, 63.5% at 256,
#: 62.4% at 2048. Each maps to the share of store-everything hiremate must plan within.
#: Shares are of the store-everything peak with buffer reuse (the ReLU backwards write into
#: their gradients), about 10% below autograd's here: the least peaks in bytes are as before,
#: but zfnet512's is 75.2% of it at batch 64 and bvlc_alexnet's 51.3% at 512 (67.1% and
#: 48.8% of autograd's).
ZOO_NOT_AT_HALF = {"zfnet512": 0.76, "bvlc_alexnet": 0.52}
#: Seconds of planning for the graphs small enough for hiremate to run Checkmate's MILP too
#: (the MILP rarely proves these budgets optimal: it would take hiremate's whole minute).
ZOO_TIME_LIMIT = {"bvlc_alexnet": 10, "vgg19": 10, "zfnet512": 10}
#: Quick enough on two CPU cores to train a step in CI (batch 1, as shipped); the other five
#: train too (README), in 10-40 s each.
ZOO_TRAINED = ["squeezenet", "shufflenet", "inception_v1", "resnet50"]


def test_the_zoo_is_shipped_in_the_onnx_package():
    assert set(ZOO) == set(ZOO_AT_HALF) | set(ZOO_NOT_AT_HALF)


#: Planned by `make test-all` alone: squeezenet and shufflenet stay in `make test` for the
#: graphs planned at half, zfnet512 for those refused there (and for hiremate's MILP under a
#: time limit); vgg19, a chain like them at batch 1024, took 41 s of `make test` (2026-12-02).
ZOO_PLANNED_IN_TEST_ALL = ("densenet121", "inception_v1", "inception_v2", "resnet50", "bvlc_alexnet",
                           "vgg19")
#: Trained by `make test-all` alone (squeezenet and shufflenet stay in `make test`).
ZOO_TRAINED_IN_TEST_ALL = ("inception_v1", "resnet50")


@pytest.mark.parametrize("name", some_slow(sorted(ZOO), ZOO_PLANNED_IN_TEST_ALL))
def test_zoo_graph_lowers_and_solves(name):
    """The shipped weight-stripped graph (opset 9, each weight a ConstantOfShape, trained as
    a parameter), at batch 64 (vgg19: 1024): at batch 1, parameter gradients alone exceed
    half the peak."""
    batch = ZOO_BATCH.get(name, 64)
    module, examples = onnx_frontend.to_torch(om.rebatched(ZOO[name], batch), trainable="constants")
    assert module.onnx_opset == 13 and len(list(module.parameters())) > 10
    graph = lower_onnx_module(module, examples, cost_model="flops")
    reference = ir.store_all(graph)
    limit = ZOO_TIME_LIMIT.get(name)
    if name in ZOO_AT_HALF:
        schedule = solve(graph, "50%", ZOO_AT_HALF[name], time_limit_s=limit)
    else:
        with pytest.raises(InfeasibleBudget) as info:
            solve(graph, "50%", "hiremate", time_limit_s=limit)
        # The least peak found, and one hiremate plans within.
        assert info.value.smallest_feasible <= ZOO_NOT_AT_HALF[name] * reference.predicted_peak_bytes
        schedule = solve(graph, info.value.smallest_feasible, "hiremate", time_limit_s=limit)
    result = ir.simulate(graph, schedule)
    assert result.valid and result.peak_bytes <= schedule.budget_bytes
    if name in ZOO_AT_HALF:
        assert result.peak_bytes <= reference.predicted_peak_bytes // 2 and result.recomputations > 0


@pytest.mark.parametrize("name", some_slow(ZOO_TRAINED, ZOO_TRAINED_IN_TEST_ALL))
def test_zoo_graph_with_weights_matches_onnxruntime_and_trains(name):
    model = om.with_random_weights(ZOO[name])
    module, (x,) = onnx_frontend.to_torch(model)
    with torch.no_grad():
        ours = module(x)
    (reference,) = run_ort(model, (x,))
    assert relative_error(ours, torch.from_numpy(reference)) < 1e-4
    assert ours.std() > 1e-4  # the classes differ: random weights, not the shipped constants
    graph = lower_onnx_module(module, (x,), cost_model="flops")
    schedule = solve(graph, None, "sqrt")  # sqrt(k) checkpoints, the rest recomputed in backward
    assert ir.simulate(graph, schedule).recomputations > 0
    scheduled = scheduled_onnx_module(module, graph, schedule)
    assert eager_and_scheduled_step(module, scheduled, (x,), lambda outs: -outs[0][0, 7].log()) < 1e-5


# ---------------------------------------------------------------- single ops against onnxruntime

_rng = np.random.default_rng(7)


def _f(*shape):
    return _rng.normal(size=shape).astype(np.float32)


def _i(*values):
    return np.array(values, dtype=np.int64)


#: (op, inputs (None: omitted optional input), attributes, opset): the attribute
#: combinations the table converts (padding modes, negative steps, axes as inputs).
SINGLE_OPS = [
    ("Conv", [_f(1, 2, 7, 6), _f(4, 2, 3, 3), _f(4)], dict(auto_pad="SAME_UPPER", strides=[2, 2]), 18),
    ("Conv", [_f(1, 4, 7, 6), _f(4, 2, 3, 2)], dict(pads=[0, 1, 2, 1], group=2, dilations=[2, 1]), 18),
    ("ConvTranspose", [_f(1, 2, 4, 5), _f(2, 3, 3, 3), _f(3)], dict(strides=[2, 2], pads=[1, 0, 0, 1],
                                                                     output_padding=[1, 1]), 18),
    ("MaxPool", [_f(1, 2, 7, 7)], dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 0, 0],
                                       ceil_mode=1), 18),
    ("AveragePool", [_f(1, 2, 6, 7)], dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), 18),
    ("AveragePool", [_f(1, 2, 6, 7)], dict(kernel_shape=[2, 3], pads=[0, 2, 1, 0], count_include_pad=1), 18),
    ("LRN", [_f(1, 6, 3, 3)], dict(size=3, alpha=0.01, beta=0.7, bias=1.5), 18),
    ("LRN", [_f(2, 7, 4, 5)], dict(size=5, alpha=0.02, beta=0.6), 18),
    ("Gemm", [_f(3, 4), _f(5, 3), _f(1, 5)], dict(transA=1, transB=1, alpha=0.5, beta=2.0), 18),
    ("Slice", [_f(5, 6), _i(-1, 4), _i(-10, 0), _i(0, 1), _i(-2, -1)], {}, 18),
    ("Slice", [_f(5, 6), _i(1), _i(100), _i(-1), None], {}, 18),
    ("Pad", [_f(2, 3, 4), _i(0, 1, 2, 0, 2, 1), np.array(1.5, np.float32)], dict(mode="constant"), 18),
    ("Pad", [_f(1, 2, 5), _i(2, 1), None, _i(-1)], dict(mode="reflect"), 18),
    ("Pad", [_f(1, 2, 5), _i(0, 0, 1, 0, 0, 3)], dict(mode="edge"), 13),
    ("CumSum", [_f(3, 4), np.array(1, np.int64)], dict(exclusive=1, reverse=1), 18),
    ("Split", [_f(7, 2)], dict(axis=0, num_outputs=3), 18),
    ("Split", [_f(2, 6), _i(1, 5)], dict(axis=1), 13),
    ("GatherND", [_f(2, 3, 4), np.array([[1], [0]], np.int64)], dict(batch_dims=1), 18),
    ("GatherElements", [_f(3, 4), np.array([[0, -1], [2, 1], [1, 1]], np.int64)], dict(axis=1), 18),
    ("ScatterElements", [_f(3, 4), np.array([[0, 3], [2, 1]], np.int64), _f(2, 2)],
     dict(axis=1, reduction="add"), 18),
    ("Einsum", [_f(2, 3, 4), _f(2, 4, 5)], dict(equation="bij,bjk->bik"), 18),
    ("Trilu", [_f(2, 4, 4), np.array(-1, np.int64)], dict(upper=0), 18),
    ("Expand", [_f(3, 1), _i(2, 1, 4)], {}, 18),
    ("Tile", [_f(2, 3), _i(2, 1)], {}, 18),
    ("ReduceMean", [_f(2, 3, 4), _i(-1, 0)], dict(keepdims=0), 18),
    ("ReduceMax", [_f(2, 3, 4)], dict(axes=[1], keepdims=1), 13),
    ("ReduceL2", [_f(2, 3, 4), _i(1)], {}, 18),
    ("ReduceLogSumExp", [_f(2, 3, 4), None], dict(keepdims=0), 18),
    ("ArgMax", [np.array([[1, 3, 3], [2, 2, 0]], np.float32)], dict(axis=1, select_last_index=1), 18),
    ("TopK", [_f(3, 5), _i(2)], dict(axis=1, largest=0), 18),
    ("GroupNormalization", [_f(2, 4, 3), _f(4), _f(4)], dict(num_groups=2, epsilon=1e-3), 21),
    ("InstanceNormalization", [_f(2, 3, 5), _f(3), _f(3)], {}, 18),
    ("BatchNormalization", [_f(2, 3, 4), _f(3), _f(3), _f(3), np.abs(_f(3)) + 0.5], {}, 15),
    ("Div", [_i(7, -7, 9), _i(2, 2, -4)], {}, 18),
    ("Mod", [_i(7, -7, 9), _i(3, 3, -4)], {}, 18),
    ("Where", [np.array([True, False, True]), _f(3), np.array(-1.0, np.float32)], {}, 18),
    ("Clip", [_f(4), np.array(-0.2, np.float32)], {}, 13),
    ("Gelu", [_f(5)], dict(approximate="tanh"), 20),
    ("HardSigmoid", [_f(5)], dict(alpha=0.3), 18),
    ("Softmax", [_f(2, 3, 4)], dict(axis=1), 13),
    ("LogSoftmax", [_f(2, 3)], {}, 18),
    ("Range", [np.array(1, np.int64), np.array(10, np.int64), np.array(3, np.int64)], {}, 18),
    ("OneHot", [_i(1, 0, -1), np.array(3, np.int64), np.array([0.0, 2.0], np.float32)], dict(axis=0), 18),
    ("OneHot", [_i(0, 5, 2, -7, -4), np.array(4, np.int64), np.array([0.0, 1.0], np.float32)], {}, 18),
    ("DepthToSpace", [_f(2, 12, 2, 3)], dict(blocksize=2), 18),
    ("DepthToSpace", [_f(2, 18, 2, 1)], dict(blocksize=3, mode="CRD"), 18),
    ("SpaceToDepth", [_f(2, 3, 4, 6)], dict(blocksize=2), 18),
    ("Pow", [_i(2, 3, 4), np.array([0.5, 1.0, 2.0], np.float32)], {}, 15),
    ("Range", [np.array(-1e-9, np.float32), np.array(1, np.float32), np.array(0.5, np.float32)], {}, 18),
    # Composite reductions over no axis still apply their elementwise steps.
    *[(name, [_f(2, 3), np.zeros(0, np.int64)], dict(noop_with_empty_axes=1), 18)
      for name in ("ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceSum", "ReduceMax")],
    ("ReduceLogSum", [np.abs(_f(2, 3)) + 0.1, None], dict(noop_with_empty_axes=1), 18),
    ("SoftmaxCrossEntropyLoss", [_f(3, 4), _i(1, 3, 0)], dict(reduction="sum"), 18),
    ("NegativeLogLikelihoodLoss", [_f(3, 4, 2), np.array([[0, 1], [3, 3], [2, 0]], np.int64), _f(4)],
     dict(ignore_index=3), 18),
]


@pytest.mark.parametrize("op, inputs, attrs, opset", SINGLE_OPS,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(SINGLE_OPS)])
def test_single_op_matches_onnxruntime(op, inputs, attrs, opset):
    assert_single_op_matches_onnxruntime(op, inputs, attrs, opset)


def assert_single_op_matches_onnxruntime(op, inputs, attrs, opset=18):
    """`op` over `inputs` with `attrs`, imported and run in torch, gives onnxruntime's
    outputs: integers equal, floats within 1e-5 relative or 1e-6 apart."""
    names = [f"in{i}" if a is not None else "" for i, a in enumerate(inputs)]
    # Inputs the table needs at import (shapes, axes, pads), and Range's, are initializers;
    # the others are graph inputs.
    static = set(range(len(inputs))) if op == "Range" else onnx_frontend.OPS[op].static
    inits = [numpy_helper.from_array(a, n) for i, (n, a) in enumerate(zip(names, inputs))
             if a is not None and i in static]
    runtime = [(n, a) for i, (n, a) in enumerate(zip(names, inputs)) if a is not None and i not in static]
    infos = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
             for n, a in runtime]
    n_out = {"Split": 3 if "num_outputs" in attrs else 2, "TopK": 2}.get(op, 1)
    outs = [f"out{i}" for i in range(n_out)]
    node = helper.make_node(op, names, outs, name=f"the_{op}", **attrs)
    graph = helper.make_graph([node], op, infos, [helper.make_empty_tensor_value_info(o) for o in outs],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    given = tuple(torch.from_numpy(a) for _, a in runtime)
    module, _ = onnx_frontend.to_torch(model, given)
    ours = as_tuple(module(*given))
    theirs = run_ort(model, given)
    assert len(ours) == len(theirs)
    for o, t in zip(ours, theirs):
        t = torch.from_numpy(np.asarray(t))
        assert o.dtype == t.dtype and o.shape == t.shape, (o.dtype, o.shape, t.dtype, t.shape)
        # Floats within 1e-5 of the larger output, or 1e-6 apart: an output near zero by
        # cancellation (a GRU's state, -0.0026 after steps of order 1) differs relatively more
        # (7.5e-8 apart, 2.8e-5 relative: a fresh clone's CI, 2026-12-07).
        assert (torch.equal(o, t) if not o.is_floating_point() or not o.numel()
                else relative_error(o, t) < 1e-5 or bool(((o - t).abs() <= 1e-6).all())), (o, t)


@settings(max_examples=40, deadline=None)
@given(size=st.integers(1, 5), kernel=st.integers(1, 4), stride=st.integers(1, 3),
       dilation=st.integers(1, 2), out_pad=st.integers(0, 2), change=st.integers(-3, 3),
       auto_pad=st.sampled_from(["NOTSET", "SAME_UPPER", "SAME_LOWER"]), dims=st.integers(1, 2))
def test_transposed_convolution_to_an_output_shape_matches_onnxruntime(size, kernel, stride, dilation,
                                                                       out_pad, change, auto_pad, dims):
    """ConvTranspose asked for an `output_shape`: the padding it implies is split as the
    spec says (the larger half first, but for SAME_UPPER; halves truncated toward zero).
    Unset `auto_pad` was split as SAME_UPPER and a negative total rounded down: outputs
    shifted by one position, 6.4 off onnxruntime's, silently."""
    # onnxruntime takes an output up to stride - 1 larger than the full one without
    # output padding (the convolution it inverts would have ignored that much input).
    assume(out_pad < max(stride, dilation) and out_pad + change < stride)
    full = (size - 1) * stride + (kernel - 1) * dilation + 1 + out_pad
    target = full + change
    assume(target > 0)
    inputs = [_f(1, 2, *[size] * dims), _f(2, 3, *[kernel] * dims), _f(3)]
    try:
        assert_single_op_matches_onnxruntime("ConvTranspose", inputs, dict(
            strides=[stride] * dims, dilations=[dilation] * dims, output_padding=[out_pad] * dims,
            output_shape=[target] * dims, auto_pad=auto_pad))
    except ort.capi.onnxruntime_pybind11_state.InvalidArgument as refused:   # no answer to compare with
        assume("output_shape is inconsistent" not in str(refused))
        raise


@settings(max_examples=30, deadline=None)
@given(rows=st.lists(st.lists(st.integers(0, 2), min_size=5, max_size=5), min_size=1, max_size=3),
       k=st.integers(1, 5), largest=st.integers(0, 1))
def test_top_k_with_ties_gives_the_lower_index_first_as_onnxruntime(rows, k, largest):
    """TopK over values with many ties: ONNX puts the lower index first; torch.topk
    ordered ties as its kernel found them ([1, 7, 5] for onnxruntime's [1, 2, 3]).
    (With `sorted=0` the spec leaves the order open.)"""
    x = np.array(rows, np.float32)
    assert_single_op_matches_onnxruntime("TopK", [x, _i(k)], dict(axis=-1, largest=largest))


def _answered_by_onnxruntime(op, inputs, attrs, opset=18):
    """`assert_single_op_matches_onnxruntime`, where onnxruntime computes an answer (it
    refuses some attribute combinations the strategies draw: nothing to compare with)."""
    import onnxruntime as ort

    try:
        assert_single_op_matches_onnxruntime(op, inputs, attrs, opset)
    except (ort.capi.onnxruntime_pybind11_state.InvalidArgument,
            ort.capi.onnxruntime_pybind11_state.Fail, ort.capi.onnxruntime_pybind11_state.RuntimeException):
        assume(False)


@settings(max_examples=60, deadline=None)
@given(op=st.sampled_from(["MaxPool", "AveragePool"]), dims=st.integers(1, 2), data=st.data(),
       ceil=st.integers(0, 1), include=st.integers(0, 1))
def test_pooling_with_any_padding_matches_onnxruntime(op, dims, data, ceil, include):
    """Pools with asymmetric or large pads and `ceil_mode`: a window that would start in
    the right padding is left out, as the spec and onnxruntime say. The table padded
    explicitly and pooled without padding, so torch kept such windows: a max of -inf, an
    average of 0/0 or over fewer values, silently (found by a review)."""
    kernel = data.draw(st.lists(st.integers(1, 4), min_size=dims, max_size=dims))
    size = data.draw(st.lists(st.integers(1, 7), min_size=dims, max_size=dims))
    strides = data.draw(st.lists(st.integers(1, 3), min_size=dims, max_size=dims))
    pads = [data.draw(st.integers(0, k - 1)) for k in kernel * 2]
    assume(all(s + p + q >= k for s, p, q, k in zip(size, pads[:dims], pads[dims:], kernel)))
    attrs = dict(kernel_shape=kernel, strides=strides, pads=pads, ceil_mode=ceil)
    if op == "AveragePool":
        attrs["count_include_pad"] = include
    _answered_by_onnxruntime(op, [_f(1, 2, *size)], attrs, 19)


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=2), data=st.data())
def test_slices_with_any_bounds_and_steps_match_onnxruntime(shape, data):
    """Starts and ends beyond either end, negative steps: ONNX clamps a start into
    [0, size - 1] when stepping back. Clamped to -1 too, a start before the first element
    made an empty slice where onnxruntime takes the first (found by a review)."""
    axes = data.draw(st.lists(st.integers(-len(shape), len(shape) - 1), min_size=1, max_size=len(shape),
                              unique_by=lambda a: a % len(shape)))
    bound = st.one_of(st.integers(-8, 8), st.sampled_from([-2 ** 63, 2 ** 63 - 1]))
    starts, ends = [data.draw(bound) for _ in axes], [data.draw(bound) for _ in axes]
    steps = [data.draw(st.sampled_from([-3, -2, -1, 1, 2, 3])) for _ in axes]
    # onnxruntime reads an end of INT64_MAX stepping back as "to the first element"; the
    # spec clamps it to size - 1 (an empty slice), as shape inference and the table do.
    assume(not any(step < 0 and end == 2 ** 63 - 1 for step, end in zip(steps, ends)))
    _answered_by_onnxruntime("Slice", [_f(*shape), _i(*starts), _i(*ends), _i(*axes), _i(*steps)], {})


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=4), data=st.data(),
       mode=st.sampled_from(["constant", "reflect", "edge", "wrap"]))
def test_padding_any_axes_in_any_mode_matches_onnxruntime(shape, data, mode):
    """Pad's modes on any axes of any rank, negative pads cropping. F.pad pads only the
    last 1-3 axes of a tensor of 1-2 more in reflect, edge and wrap modes: both axes of a
    matrix or the batch axis were refused with F.pad's message (found by a review)."""
    top = {"reflect": lambda size: size - 1, "wrap": lambda size: 2 * size}.get(mode, lambda size: 3)
    pads = [data.draw(st.integers(-(size - 1), top(size))) for size in shape * 2]
    kept = [size + min(b, 0) + min(e, 0) for size, b, e in zip(shape, pads[:len(shape)], pads[len(shape):])]
    assume(all(size + b + e > 0 and k > 0 for size, b, e, k in zip(shape, pads[:len(shape)], pads[len(shape):], kept)))
    # A reflection reaches at most size - 1 positions of the axis as cropped (refused).
    assume(mode != "reflect" or all(max(b, e) < size for size, b, e in zip(kept, pads[:len(shape)],
                                                                          pads[len(shape):])))
    _answered_by_onnxruntime("Pad", [_f(*shape), _i(*pads)], dict(mode=mode), 18)


@settings(max_examples=40, deadline=None)
@given(size=st.integers(1, 5), kernel=st.integers(1, 4), stride=st.integers(1, 3), dilation=st.integers(1, 2),
       out_pad=st.integers(0, 2), auto_pad=st.sampled_from(["SAME_UPPER", "SAME_LOWER"]), dims=st.integers(1, 2))
def test_transposed_convolution_with_same_padding_matches_onnxruntime(size, kernel, stride, dilation, out_pad,
                                                                      auto_pad, dims):
    """SAME without an `output_shape`: a kernel smaller than the stride gives less than
    input * stride, which onnxruntime leaves unpadded (the table padded up, refused by
    its own shape check), and with `output_padding` shape inference disagrees with
    onnxruntime (the shape check refused a valid model)."""
    assume(out_pad < max(stride, dilation))
    inputs = [_f(1, 2, *[size] * dims), _f(2, 3, *[kernel] * dims), _f(3)]
    _answered_by_onnxruntime("ConvTranspose", inputs, dict(
        strides=[stride] * dims, dilations=[dilation] * dims, output_padding=[out_pad] * dims, auto_pad=auto_pad))


_RESIZE_SCALES = [0.5, 0.6, 0.7, 0.75, 0.9, 1.0, 1.1, 1.3, 1.5, 2.0, 2.5, 3.0]


@settings(max_examples=80, deadline=None)
@given(spatial=st.lists(st.integers(1, 6), min_size=1, max_size=2), data=st.data(),
       mode=st.sampled_from(["nearest", "linear", "cubic"]),
       how=st.sampled_from(["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                            "asymmetric", "tf_crop_and_resize"]))
def test_resize_in_every_mode_and_coordinate_transformation_matches_onnxruntime(spatial, data, mode, how):
    """Resize (U-Nets' and detectors' upsampling) was refused as unsupported. Every mode,
    coordinate transformation, nearest rounding, cubic coefficient and exclusion, by scales
    or by sizes, and tf_crop_and_resize's region (within the input, on scaled axes: on an
    unscaled one onnxruntime and the spec's reference disagree, refused) give
    onnxruntime's outputs. Sizes from scales are computed in float32 as onnxruntime does
    (10 * 0.7 made 6 rows where onnxruntime makes 7: found by a review)."""
    attrs = dict(mode=mode, coordinate_transformation_mode=how)
    if mode == "nearest":
        attrs["nearest_mode"] = data.draw(st.sampled_from(["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]))
    if mode == "cubic":
        attrs["cubic_coeff_a"] = data.draw(st.sampled_from([-0.75, -0.5]))
        attrs["exclude_outside"] = data.draw(st.integers(0, 1))
    shape = [1, 2, *spatial]
    if data.draw(st.booleans()):
        scales = [1.0, 1.0] + [data.draw(st.sampled_from(_RESIZE_SCALES)) for _ in spatial]
        outs = [int(np.floor(np.float32(i) * np.float32(f))) for i, f in zip(shape, scales)]
        given = [np.array(scales, np.float32), None]
        # An axis scaled but keeping its size: onnxruntime leaves it, the spec interpolates
        # (refused).
        assume(not any(o == i and f != 1 for o, i, f in zip(outs, shape, scales)))
    else:
        outs = shape[:2] + [data.draw(st.integers(1, 9)) for _ in spatial]
        given = [None, np.array(outs, np.int64)]
    assume(min(outs) > 0)
    roi = None
    if how == "tf_crop_and_resize":
        assume(all(o != i for o, i in zip(outs[2:], spatial)))
        roi = np.array([0.0, 0.0] + [data.draw(st.sampled_from([0.0, 0.125, 0.25])) for _ in spatial]
                       + [1.0, 1.0] + [data.draw(st.sampled_from([0.75, 0.875, 1.0])) for _ in spatial], np.float32)
    if mode == "nearest":
        # A coordinate on a rounding boundary in exact arithmetic (0.5 / (1/3) - 0.5) goes
        # either way by the last bit of a float (onnxruntime's kernels and the spec's
        # reference differ there too): such ties are not compared.
        from remat_ir.frontends.onnx_resize import _nearest, _source

        factors = scales[2:] if given[0] is not None else [float(np.float32(o) / np.float32(i))
                                                           for o, i in zip(outs[2:], spatial)]
        boxes = [(0.0, 1.0)] * len(spatial) if roi is None else list(zip(roi[2:2 + len(spatial)], roi[-len(spatial):]))
        assume(all(_nearest(_source(x, i, o, f, how, box), attrs["nearest_mode"])
                   == _nearest(_source(x, i, o, f, how, box, np.float64), attrs["nearest_mode"])
                   for i, o, f, box in zip(spatial, outs[2:], factors, boxes) for x in range(o)))
        # Also a tie in exact arithmetic where the scale, sizes over sizes, is not a float32:
        # both float computations here may put it on one side, onnxruntime's on the other
        # (sizes 3 -> 1, half_pixel_symmetric, floor: exactly 1.0, 1.0 here, just below 1
        # in onnxruntime, which reads position 0; found by CI, 2026-12-04).
        from fractions import Fraction

        def exact(v):
            return v if isinstance(v, Fraction) else Fraction(float(v))
        ratios = ([Fraction(o, i) for o, i in zip(outs[2:], spatial)] if given[0] is None
                  else [exact(f) for f in factors])
        tie = ((lambda c: c == math.floor(c)) if attrs["nearest_mode"] in ("floor", "ceil")
               else (lambda c: c - math.floor(c) == 0.5))
        assume(not any(tie(_source(x, i, o, r, how, box, exact))
                       for i, o, r, box in zip(spatial, outs[2:], ratios, boxes)
                       if r != exact(np.float32(float(r))) for x in range(o)))
    inputs = [_f(*shape), roi, *given]
    _answered_by_onnxruntime("Resize", inputs if given[1] is not None else inputs[:3], attrs, 19)


@pytest.mark.parametrize("first", [
    helper.make_node("Resize", ["x", "", "scales"], ["h"], mode="linear"),
    helper.make_node("MaxPool", ["x"], ["h"], kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)])
def test_nodes_after_a_known_shape_inference_disagreement_import_and_match_onnxruntime(first):
    """Where shape inference is known to disagree with onnxruntime (a Resize by 0.7 of 10
    rows: 6 in double precision, 7 in onnxruntime's float32; a pool with ceil_mode), the
    nodes after it inherit the disagreement: a Relu there was refused as an op table bug
    (found by a review)."""
    x = _f(1, 2, 10, 5)
    graph = helper.make_graph(
        [first, helper.make_node("Relu", ["h"], ["y"])], "after",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_empty_tensor_value_info("y")],
        [numpy_helper.from_array(np.array([1, 1, 0.7, 1.3], np.float32), "scales")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=10)
    given = (torch.from_numpy(x),)
    module, _ = onnx_frontend.to_torch(model, given)
    ours, theirs = module(*given), torch.from_numpy(run_ort(model, given)[0])
    assert ours.shape == theirs.shape and relative_error(ours, theirs) < 1e-5


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(["LSTM", "GRU"]), data=st.data(),
       direction=st.sampled_from(["forward", "reverse", "bidirectional"]))
def test_recurrent_layers_match_onnxruntime(kind, data, direction):
    """LSTM and GRU (nn.LSTM's and nn.GRU's exports) were refused as unsupported: with
    and without bias and initial states, peepholes, `input_forget`, `linear_before_reset`
    and `clip`, their outputs and final states are onnxruntime's."""
    hidden, size, steps, batch = (data.draw(st.integers(1, n)) for n in (4, 3, 4, 3))
    directions, gates = (2 if direction == "bidirectional" else 1), (4 if kind == "LSTM" else 3)
    inputs = [_f(steps, batch, size), _f(directions, gates * hidden, size), _f(directions, gates * hidden, hidden),
              _f(directions, 2 * gates * hidden) if data.draw(st.booleans()) else None, None,
              _f(directions, batch, hidden) if data.draw(st.booleans()) else None]
    attrs = dict(hidden_size=hidden, direction=direction)
    if data.draw(st.booleans()):
        attrs["clip"] = 0.5
    if kind == "LSTM":
        inputs += [_f(directions, batch, hidden) if data.draw(st.booleans()) else None,
                   _f(directions, 3 * hidden) if data.draw(st.booleans()) else None]
        attrs["input_forget"] = data.draw(st.integers(0, 1))
    else:
        attrs["linear_before_reset"] = data.draw(st.integers(0, 1))
    while inputs[-1] is None:
        inputs.pop()
    _answered_by_onnxruntime(kind, inputs, attrs, 14)


@pytest.mark.parametrize("name", some_slow(["lstm", "gru"], ["gru"]))
def test_exported_recurrent_models_train_like_torch(exported, name):
    """nn.LSTM and nn.GRU, two bidirectional batch-first layers, exported: the losses of 3
    SGD steps equal the torch model's within 1e-5 (the exporter packs each layer's weights
    into one W, R and B, which an elementwise optimizer steps as the separate ones)."""
    path, model, args, loss_of = exported(name)
    with torch.backends.mkldnn.flags(enabled=False):   # eager's CPU LSTM runs oneDNN otherwise
        scheduled = remat_ir.remat_onnx(path, args, solver="recompute-all", cost_model="flops")
        opt_torch = torch.optim.SGD(model.parameters(), lr=0.1)
        opt_onnx = torch.optim.SGD(scheduled.parameters(), lr=0.1)
        for step in range(3):
            loss_torch, loss_onnx = loss_of(model(*args)), loss_of(scheduled(*args))
            assert relative_error(loss_torch, loss_onnx) < 1e-5, step
            loss_torch.backward(), loss_onnx.backward()
            opt_torch.step(), opt_onnx.step()
            opt_torch.zero_grad(), opt_onnx.zero_grad()


@pytest.mark.parametrize("returned", ["x", "w"])
def test_a_graph_input_or_initializer_among_the_outputs_trains_like_eager(returned):
    """ONNX lets a graph return one of its inputs or initializers as it is. Found by a
    review: it was refused with PyTorch's advice (`.clone()`), which an ONNX user cannot
    follow; the imported module returns a copy of it, as the graph's value."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])
    shapes = {"x": [4, 8], "w": [8, 16]}
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "returns_as_is", [x],
                              [y, helper.make_tensor_value_info(returned, TensorProto.FLOAT, shapes[returned])],
                              [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    args = (torch.randn(4, 8),)
    scheduled = remat_ir.remat_onnx(model, args, solver="recompute-all", cost_model="flops")
    module, _ = onnx_frontend.to_torch(model, args)
    assert eager_and_scheduled_step(module, scheduled, args,
                                    lambda out: out[0].square().sum() + out[1].sin().sum()) == 0.0


def test_a_graph_with_nothing_to_train_says_what_an_onnx_user_can_do():
    """Found by a review: an ONNX graph whose outputs depend on no float initializer was
    told PyTorch's advice (`detach()`, `torch.no_grad()`), which means nothing there."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "nothing", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(LoweringError, match=r"OnnxModule computes no gradient: .* depend on none of its float "
                                            r"initializers .*--trainable constants\)$"):
        remat_ir.remat_onnx(model, (torch.randn(4, 8),), solver="recompute-all", cost_model="flops")
