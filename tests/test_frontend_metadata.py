"""The torch frontend's metadata in a graph file: entries not of the shape its runtime
reads are refused at load and before a run, naming the key (`ir/frontend_metadata.py`).

Found by hunt68: a malformed entry (`"[[["`, `null`, a list for an object) passed
`ir.load` and `remat-ir validate`, and the call died with a raw JSONDecodeError,
TypeError or KeyError from deep inside the runtime, naming neither the key nor what to do
(16 raw errors of 21 tries)."""

from __future__ import annotations

import json
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from remat_ir import ir
from remat_ir.ir import pb, recompute_all
from remat_ir.ir.frontend_metadata import SHAPES, metadata_problems
from remat_ir.lowering import lower_torch
from remat_ir.runtimes.torch import ScheduledModule

SCALE = 2.0


class _Rich(torch.nn.Module):
    """A model whose graph has most `torch.*` entries: a plain attribute, a global, a held
    tensor, a list it iterates, a Python draw, a branch on an input's values, a constant,
    a view of another output and a parameter among its outputs."""

    def __init__(self):
        super().__init__()
        self.fc, self.bn, self.head = torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 1)
        self.temperature = 0.5
        self.shift = torch.ones(4)
        self.scales = [1.0, 2.0]

    def forward(self, x, mask):
        h = self.bn(self.fc(x) + self.shift) * SCALE / self.temperature
        for scale in self.scales:
            h = h * scale
        if random.random() < 2.0:
            h = h + 1
        if mask.sum() > 3:
            h = h * 2
        return {"loss": self.head(h).square().mean(), "note": None, "h": h, "hv": h[:, :2],
                "w": self.head.weight}


def _inputs():
    return torch.randn(6, 4, generator=torch.Generator().manual_seed(1)), torch.ones(6)


@pytest.fixture(scope="module")
def rich() -> pb.Graph:
    torch.manual_seed(0)
    return lower_torch(_Rich(), _inputs(), cost_model="flops").proto


def _edited(proto: pb.Graph, key: str, text: str) -> pb.Graph:
    edited = pb.Graph()
    edited.CopyFrom(proto)
    edited.metadata[key] = text
    return edited


def _step(graph: pb.Graph) -> None:
    """Build the plan from `graph` on a fresh model and train one step on it."""
    torch.manual_seed(0)
    loaded = ir.Graph(graph)
    scheduled = ScheduledModule(_Rich(), loaded, recompute_all(loaded))
    loss = scheduled(*_inputs())["loss"]
    if isinstance(loss, torch.Tensor):   # an edited entry may leave a constant in its place
        loss.backward()


def _step_or_refused(graph: pb.Graph, key: str) -> None:
    """`_step` runs, or is refused in remat-ir's words, or raises with a note naming the
    entry it read (an error the model's own values may raise too keeps its type)."""
    try:
        _step(graph)
    except ir.RematIRError:
        pass
    except Exception as error:
        assert any(key in note for note in getattr(error, "__notes__", ())), error


def test_the_frontends_entries_fit_their_shapes(rich):
    """What the frontend writes is what validation asks for (else every file it saved
    would be refused at load)."""
    from exactness import SEARCH_MODELS, lowered

    assert {key for key in rich.metadata if key in SHAPES} >= set(SHAPES) - {
        "torch.input_members", "torch.stored_attributes", "torch.assigned_after", "torch.hidden_outputs",
        "torch.autocast_cast_and_read", "torch.autocast_blocks", "torch.global_tensors"}
    assert metadata_problems(rich.metadata, "torch") == []
    for name in SEARCH_MODELS:
        assert metadata_problems(lowered(name).proto.metadata, "torch") == [], name
    assert ir.find_problems(ir.loads(ir.dumps(rich))) == []


@pytest.mark.parametrize("text", ["[[[", "null", "\"x\"", "-1"])
def test_a_malformed_entry_is_refused_at_load_and_before_a_run_naming_its_key(rich, text):
    for key in sorted(SHAPES):
        value = _json_or_none(text)
        if key not in rich.metadata or (value is not _NOT_JSON and SHAPES[key].problem(value) is None):
            continue
        edited = _edited(rich, key, text)
        with pytest.raises(ir.InvalidGraph, match=f"metadata '{key}' must be .*lower the model again"):
            ir.loads(ir.dumps(edited))
        with pytest.raises(ir.InvalidGraph, match=f"metadata '{key}' must be"):
            _step(edited)


_NOT_JSON = object()


def _json_or_none(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return _NOT_JSON


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 9) | st.floats(allow_nan=False)
                     | st.sampled_from(["", "fc", "fc.weight", "param", "torch.float32", "builtins.bool"]),
                     lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.sampled_from(["0", "1", "3", "x", "modules", "aliases", "hooks",
                                                        "nested", "per_reader", "decision", "inputs",
                                                        "args", "kwargs", "answer"]), inner, max_size=5),
                     max_leaves=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(sorted(SHAPES)), value=_JSON)
def test_an_entry_of_any_value_is_refused_by_its_key_or_runs_or_is_refused_by_the_runtime(rich, key, value):
    """Random JSON in one entry: validation refuses it naming the key, or the plan runs,
    or the runtime refuses the call in its own words (a `RematIRError`); never a raw
    error from inside."""
    edited = _edited(rich, key, json.dumps(value))
    problems = metadata_problems(edited.metadata, "torch")
    if problems:
        assert len(problems) == 1 and f"metadata {key!r}" in problems[0]
        return
    _step_or_refused(edited, key)


def _mutated(data, value):
    """`value` with one part, drawn at any depth, replaced by random JSON or left out."""
    if isinstance(value, (list, dict)) and value and data.draw(st.booleans()):
        keys = list(range(len(value))) if isinstance(value, list) else list(value)
        key = data.draw(st.sampled_from(keys))
        copy = list(value) if isinstance(value, list) else dict(value)
        if data.draw(st.integers(0, 4)) == 0:
            del copy[key]
        else:
            copy[key] = _mutated(data, value[key])
        return copy
    return data.draw(_JSON)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_an_entry_changed_in_one_part_is_refused_by_its_key_or_runs_or_is_refused_by_the_runtime(rich, data):
    """As above, from the frontend's own entry with one part changed at any depth: the
    shapes of the entries' rows and objects are what their runtime unpacks."""
    key = data.draw(st.sampled_from(sorted(k for k in SHAPES if k in rich.metadata)))
    edited = _edited(rich, key, json.dumps(_mutated(data, json.loads(rich.metadata[key]))))
    problems = metadata_problems(edited.metadata, "torch")
    if problems:
        assert len(problems) == 1 and f"metadata {key!r}" in problems[0]
        return
    _step_or_refused(edited, key)
