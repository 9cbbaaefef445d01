"""A forward that sets Python's or NumPy's global generator before drawing from it.

BigBird's block-sparse attention seeds NumPy's generator in every layer
(`np.random.seed(layer)`) and then permutes blocks with it. Lowered fresh, the draws
moved the generator and were refused; lowered after one eager call (users run an
evaluation or a step before `remat`), the generator was already at the state the forward
leaves, the draws went unseen, and every step left NumPy's generator where the caller had
it instead of at the seed's state, as eager does. A forward that saves the state, draws,
and puts the state back leaves it unmoved too, while eager draws other numbers at every
step: the graph held the numbers drawn while tracing, silently. A forward seeding without
drawing left the caller's later draws other than eager's (hunt79). The model's calls that
seed or set these generators are refused by line, fresh or after a call
(`frontends/trace_effects.refusing_trace_effects`); a call drawing nothing (`random.sample(
pop, 0)`) trains as before.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import remat_ir
from remat_ir.frontends.errors import LoweringError


def _seeded(generator: str):
    """Pick 4 of 8 columns by a permutation drawn right after seeding `generator`."""
    if generator == "numpy":
        np.random.seed(3)
        return torch.as_tensor(np.random.permutation(8)[:4].copy())
    random.seed(3)
    return torch.tensor(random.sample(range(8), 4))


def _put_back_unwatched(generator: str):
    """The state put back by a way the tracing hooks do not watch (hunt79 F5)."""
    if generator == "numpy":
        state = np.random.get_state()
        columns = np.random.permutation(8)[:4].copy()
        np.random.mtrand.set_state(state)
        return torch.as_tensor(columns)
    state = random.getstate()
    columns = random.sample(range(8), 4)
    random._inst.setstate(state)
    return torch.tensor(columns)


def _seeded_alone(generator: str):
    """The generator seeded, nothing drawn: the caller's next draws are the seed's."""
    (np.random.seed if generator == "numpy" else random.seed)(3)
    return torch.arange(4)


def _put_back(generator: str):
    """The same columns drawn with the caller's state, which is then put back."""
    if generator == "numpy":
        state = np.random.get_state()
        columns = np.random.permutation(8)[:4].copy()
        np.random.set_state(state)
        return torch.as_tensor(columns)
    state = random.getstate()
    columns = random.sample(range(8), 4)
    random.setstate(state)
    return torch.tensor(columns)


class _Columns(torch.nn.Module):
    def __init__(self, pick):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.pick = pick

    def forward(self, x):
        return self.proj(x)[:, self.pick()].sum()


@pytest.mark.parametrize("generator", ["numpy", "python"])
@pytest.mark.parametrize("how", ["seeded", "put_back", "seeded_alone", "put_back_unwatched"])
@pytest.mark.parametrize("called_first", [False, True], ids=["fresh", "after_a_call"])
def test_a_draw_that_leaves_the_generator_where_it_was_is_refused_naming_the_line(generator, how, called_first):
    pick = {"seeded": _seeded, "put_back": _put_back, "seeded_alone": _seeded_alone,
            "put_back_unwatched": _put_back_unwatched}[how]
    torch.manual_seed(0)
    model = _Columns(lambda: pick(generator))
    x = torch.randn(2, 8)
    if called_first:
        model(x).backward()
        model.zero_grad(set_to_none=True)
    calls = {("numpy", "put_back"): r"numpy\.random\.set_state", ("python", "put_back"): r"random\.setstate"}.get(
        (generator, how), {"numpy": r"numpy\.random\.seed", "python": r"random\.seed"}[generator])
    said = rf"calls {calls} at .*test_seeded_draws\.py"
    if how == "put_back_unwatched":
        said = rf"draws from {'NumPy' if generator == 'numpy' else 'Python'}'s random generator \(.*test_seeded_draws\.py"
    with pytest.raises(LoweringError, match=said):
        remat_ir.remat(model, (x,), solver="recompute-all", cost_model="flops")


class _DrawsNothing(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        order = [0]
        random.shuffle(order)   # one item: no number drawn
        return self.proj(x)[:, order + random.sample(range(8), 0) + list(np.random.rand(0).astype(int))].sum()


def test_a_call_of_a_drawing_function_that_draws_nothing_trains_like_eager():
    """hunt79 F0: refused for a while as a draw that set the state first."""
    from exactness import side_by_side

    x = torch.randn(2, 8)
    assert side_by_side(_DrawsNothing(), lambda m: remat_ir.remat(m, (x,), solver="recompute-all", cost_model="flops"),
                        (x,), {}, lambda out: out, steps=2) == {}
