"""Simulator peaks, times and violations on graphs worked out by hand.

Chain of n (see builders.chain): every tensor is m = 1000 bytes; the input x
and the output gradient g_n are resident (not counted).
"""

import pytest

from remat_ir import ir
from builders import chain, schedule

M = 1000  # bytes per tensor in builders.chain


def backward_step(i, n, ids):
    """b_i, then free what it was the last to read: a_{i-1} (x is resident) and g_i (g_n is)."""
    steps = [("compute", ids[f"b{i}"])]
    if i > 1:
        steps.append(("free", ids[f"a{i-1}"]))
    if i < n:
        steps.append(("free", ids[f"g{i}"]))
    return steps


def store_everything_by_hand(n, ids):
    """Forward keeping a1..an, then backward (as autograd)."""
    steps = [("compute", ids[f"f{i}"]) for i in range(1, n + 1)]
    fwd = len(steps)
    for i in range(n, 0, -1):
        steps += backward_step(i, n, ids)
    return schedule(steps, fwd, name="store")


def recompute_from_input_by_hand(n, ids):
    """Keep only the output; before each b_i, recompute a_1..a_{i-1} from x."""
    steps = []

    def run_forward_to(last):
        for j in range(1, last + 1):
            steps.append(("compute", ids[f"f{j}"]))
            if j > 1:
                steps.append(("free", ids[f"a{j-1}"]))

    run_forward_to(n)
    fwd = len(steps)
    for i in range(n, 0, -1):
        run_forward_to(i - 1)
        steps += backward_step(i, n, ids)
    return schedule(steps, fwd, name="recompute")


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_chain_stored_entirely(n):
    g, ids = chain(n, f_time=1.0, b_time=2.0)
    result = ir.check(g, store_everything_by_hand(n, ids))
    # a1..an live after forward; the first backward step adds g_{n-1}.
    assert result.peak_bytes == (n + 1) * M
    assert result.forward_time_s == n * 1.0 and result.backward_time_s == n * 2.0
    assert result.recomputations == 0
    assert result.saved_bytes == (n - 1) * M  # a1..a_{n-1}; a_n is the output
    assert result.resident_bytes == 2 * M     # x and g_n
    assert result.memory_after[n - 1] == n * M


@pytest.mark.parametrize("n", [3, 5, 8])
def test_chain_recomputed_from_input(n):
    g, ids = chain(n, f_time=1.0, b_time=2.0)
    result = ir.check(g, recompute_from_input_by_hand(n, ids))
    # Recomputing a_j inside backward i: output a_n, gradient g_i, a_{j-1}, a_j.
    assert result.peak_bytes == 4 * M
    assert result.recomputations == n * (n - 1) // 2
    assert result.forward_time_s == n * 1.0
    assert result.backward_time_s == n * (n - 1) // 2 * 1.0 + n * 2.0
    assert result.saved_bytes == 0
    assert result.memory_after[n * 2 - 2] == M  # only the output is live after forward


def test_library_store_all_matches_hand_schedule():
    g, ids = chain(6)
    by_hand = ir.check(g, store_everything_by_hand(6, ids))
    built = ir.store_all(g)
    assert ir.check(g, built).peak_bytes == by_hand.peak_bytes == built.predicted_peak_bytes


def test_recompute_all_keeps_nothing_for_backward():
    g, _ = chain(6, f_time=1.0)
    result = ir.check(g, ir.recompute_all(g))
    assert result.saved_value_ids == [] and result.saved_bytes == 0
    assert result.recomputations == 5  # f1..f5 again (a6 is the output, kept)


def test_workspace_counts_during_its_step_only():
    g, ids = chain(3, workspace={2: 10_000})
    result = ir.check(g, store_everything_by_hand(3, ids))
    assert result.peak_bytes == 2 * M + 10_000  # a1, a2 live while f2 runs with its workspace
    assert result.peak_step == 1
    assert result.memory_after[1] == 2 * M


def test_views_share_their_storage():
    g = ir.Graph()
    x = g.add_value("x", "float32", (250,), kind="user_input")
    g.add_input(x)
    a = g.add_value("a", "float32", (250,))
    v = g.add_value("a_view", "float32", (25, 10), alias_of=a)
    out = g.add_value("out", "float32", (), kind="output")
    f = g.add_node("test.f", [x], [a], phase="forward")
    view = g.add_node("aten.view.default", [a], [v], phase="forward", args=[ir.TensorRef(a), [25, 10]])
    s = g.add_node("test.sum", [v], [out], phase="forward")
    g.add_output(out, "user_output")
    sched = schedule([("compute", f), ("compute", view), ("free", a), ("compute", s), ("free", v)], 5)
    result = ir.check(g, sched)
    assert result.memory_during == [M, M, M, M + 4, M + 4]
    assert result.memory_after == [M, M, M, M + 4, 4]   # the storage goes when its last view does
    # A view of a parameter costs nothing.
    w = g.add_value("w", "float32", (250,), kind="parameter")
    g.add_input(w)
    wt = g.add_value("w_t", "float32", (250,), alias_of=w)
    t = g.add_node("aten.t.default", [w], [wt], phase="forward")
    assert ir.simulate(g, schedule([("compute", t)], 1)).peak_bytes == 0


def test_recomputing_a_live_value_counts_both_copies():
    g, ids = chain(2)
    sched = schedule([("compute", ids["f1"]), ("compute", ids["f1"]), ("compute", ids["f2"]),
                      ("compute", ids["b2"]), ("free", ids["a1"]), ("compute", ids["b1"]),
                      ("free", ids["g1"])], 3)
    result = ir.check(g, sched)
    assert result.memory_during[:2] == [M, 2 * M]
    assert result.memory_after[:2] == [M, M]


# ---------------------------------------------------------------- violations

def first_violation(g, sched, **kw):
    result = ir.simulate(g, sched, **kw)
    assert not result.valid
    return result.violation


def test_use_of_a_freed_value():
    g, ids = chain(3)
    steps = [("compute", ids["f1"]), ("compute", ids["f2"]), ("free", ids["a1"]),
             ("compute", ids["f3"]), ("compute", ids["b3"]), ("compute", ids["b2"])]
    v = first_violation(g, schedule(steps, 4))
    assert (v.step, v.kind, v.node_id, v.value_id) == (5, "input_not_live", ids["b2"], ids["a1"])
    assert str(v) == "step 5: node 'b_4' (test.b, id 4) reads value 'a1' (id 1), which is not live"
    with pytest.raises(ir.InvalidSchedule, match="schedule 'hand' is invalid: step 5: node 'b_4'"):
        ir.check(g, schedule(steps, 4))


def test_free_twice_and_free_of_inputs_and_outputs():
    g, ids = chain(2)
    v = first_violation(g, schedule([("compute", ids["f1"]), ("free", ids["a1"]), ("free", ids["a1"])], 3))
    assert (v.step, v.kind, v.value_id) == (2, "free_not_live", ids["a1"])
    v = first_violation(g, schedule([("free", ids["a0"])], 1))
    assert (v.step, v.kind) == (0, "free_resident")
    v = first_violation(g, schedule([("compute", ids["f1"]), ("compute", ids["f2"]), ("free", ids["a2"])], 3))
    assert (v.step, v.kind, v.value_id) == (2, "free_output", ids["a2"])


def test_budget_exceeded_names_step_and_node():
    g, ids = chain(4)
    sched = store_everything_by_hand(4, ids)
    v = first_violation(g, sched, budget=4 * M)
    assert (v.step, v.kind, v.node_id) == (4, "budget_exceeded", ids["b4"])
    assert "memory reaches 5000 bytes, over the budget of 4000 bytes" in str(v)
    sched.budget_bytes = 5 * M
    assert ir.simulate(g, sched).valid
    sched.budget_bytes = 5 * M - 1
    assert ir.simulate(g, sched).violation.kind == "budget_exceeded"


def test_missing_outputs():
    g, ids = chain(2)
    v = first_violation(g, schedule([("compute", ids["f1"])], 1))
    assert (v.step, v.kind, v.value_id) == (1, "output_missing", ids["a2"])
    full = [("compute", ids[k]) for k in ("f1", "f2", "b2")]
    v = first_violation(g, schedule(full, 2))
    assert (v.step, v.kind, v.value_id) == (3, "output_missing", ids["g0"])


def test_output_gradient_only_in_backward():
    g, ids = chain(1)
    v = first_violation(g, schedule([("compute", ids["f1"]), ("compute", ids["b1"])], 2))
    assert (v.step, v.kind, v.value_id) == (1, "gradient_before_backward", ids["g1"])


def test_mutating_and_random_nodes():
    g, ids = chain(2)
    steps = [("compute", ids["f1"]), ("compute", ids["f1"])]
    g.node(ids["f1"]).random = True
    assert first_violation(g, schedule(steps, 2)).kind == "random_recompute"
    assert ir.simulate(g, schedule(steps, 2, rng_replay=True)).violation.kind == "output_missing"
    g.node(ids["f1"]).mutating = True
    v = first_violation(g, schedule(steps, 2, rng_replay=True))
    assert (v.step, v.kind, v.node_id) == (1, "recompute_forbidden", ids["f1"])


def test_a_replay_holds_the_generator_state_beside_its_outputs():
    """chain(2), 1,000-byte values, f1 random and recomputed after a free: the replay at
    step 3 sets the generator back while its output exists, so with 300 replay bytes
    that step's memory is a2 and a1 (2,000) + 300; the first run (step 0) draws, no replay."""
    g, ids = chain(2, elements=250)
    g.node(ids["f1"]).random = True
    steps = [("compute", ids["f1"]), ("compute", ids["f2"]), ("free", ids["a1"]),
             ("compute", ids["f1"]), ("compute", ids["b2"]), ("free", ids["a1"]),
             ("compute", ids["b1"])]
    hand = schedule(steps, 4, rng_replay=True)
    before = ir.simulate(g, hand)
    g.proto.provenance.rng_replay_bytes = 300
    after = ir.simulate(g, hand)
    assert before.valid and after.valid
    assert after.memory_during[3] == before.memory_after[3] + 300 == 1000 + 1000 + 300
    assert after.memory_during[0] == before.memory_during[0] == 1000
    assert after.peak_bytes == max(before.peak_bytes, 2300)


def linked(g, *, overlapped=True, bandwidth=1000.0, latency=0.5):
    """`g` with a host link: a 1000-byte tensor (M) takes 1.5 s to move by default."""
    link = g.proto.provenance.host_link
    link.bandwidth_bytes_per_s, link.latency_s, link.overlapped = bandwidth, latency, overlapped
    return g


def test_offload_and_prefetch():
    """Offload a1 after forward, free it, prefetch it for b2: by hand, with a 1.5 s link."""
    g, ids = chain(2, f_time=1.0, b_time=2.0)
    linked(g)
    fwd = [("compute", ids["f1"]), ("compute", ids["f2"]), ("offload", ids["a1"]),
           ("free", ids["a1"])]
    bwd = [("compute", ids["b2"]), ("free", ids["a1"]), ("compute", ids["b1"]), ("free", ids["g1"])]
    result = ir.check(g, schedule(fwd + [("prefetch", ids["a1"])] + bwd, 4))
    # Memory: the offload keeps a1 on the device until its free; the prefetch allocates it.
    assert result.memory_after[:5] == [M, 2 * M, 2 * M, M, 2 * M]
    assert result.peak_bytes == 3 * M and result.host_peak_bytes == M
    # Time: the offload runs 2 -> 3.5 and the free waits for it; the prefetch runs 3.5 -> 5
    # and b2 waits for it: 1.5 s of stall each.
    assert result.forward_time_s == 3.5 and result.backward_time_s == 5.5
    assert result.stall_s == 3.0 and result.transfer_s == 3.0 and result.transferred_bytes == 2 * M
    v = first_violation(g, schedule(fwd + bwd, 4))
    assert v.kind == "input_not_live" and "offloaded; prefetch it first" in v.message
    v = first_violation(g, schedule([("prefetch", ids["a1"])], 1))
    assert v.kind == "prefetch_not_offloaded"


def test_transfers_overlap_compute_only_on_an_overlapped_link():
    """Offloading a1 while f2 runs hides the transfer on a copy stream, not on a CPU copy."""
    g, ids = chain(2, f_time=1.0, b_time=2.0)
    steps = [("compute", ids["f1"]), ("offload", ids["a1"]), ("compute", ids["f2"]),
             ("free", ids["a1"]), ("prefetch", ids["a1"]), ("compute", ids["b2"]),
             ("free", ids["a1"]), ("compute", ids["b1"]), ("free", ids["g1"])]
    overlapped = ir.check(linked(g), schedule(steps, 4))
    assert (overlapped.forward_time_s, overlapped.stall_s) == (2.5, 0.5 + 1.5)
    serial = ir.check(linked(g, overlapped=False), schedule(steps, 4))
    assert (serial.forward_time_s, serial.stall_s) == (3.5, 0.0)
    assert serial.total_time_s == 3.5 + 1.5 + 4.0
    # Without a described link transfers take no time.
    g.proto.provenance.ClearField("host_link")
    assert ir.check(g, schedule(steps, 4)).total_time_s == 6.0


def test_transfer_rules():
    g, ids = chain(2)
    a1, a2 = ids["a1"], ids["a2"]
    f1, f2 = ("compute", ids["f1"]), ("compute", ids["f2"])
    cases = [
        ([f1, ("offload", a1), ("prefetch", a1)], "prefetch_live"),
        ([f1, ("offload", a1), ("offload", a1)], "already_offloaded"),
        ([f1, f2, ("free", a2)], "free_output"),
        ([f1, ("offload", a1), f1], "offload_pending"),
        ([("offload", a1)], "offload_not_live"),
    ]
    for steps, kind in cases:
        assert first_violation(g, schedule(steps, len(steps))).kind == kind, kind
    # A graph output may leave the device once a copy is on the host, and must be back
    # when it is due (a forward output when backward starts).
    out = [f1, f2, ("offload", a2), ("free", a2)]
    assert first_violation(g, schedule(out, 4)).kind == "output_missing"
    tail = [("compute", ids["b2"]), ("free", a1), ("compute", ids["b1"]), ("free", ids["g1"])]
    assert ir.check(g, schedule(out + [("prefetch", a2)] + tail, 5)).host_peak_bytes == M
    # Recomputing a value whose offload was freed drops its host copy.
    steps = [f1, ("offload", a1), ("free", a1), f1, f2]
    assert first_violation(g, schedule(steps + [("prefetch", a1)], 5)).kind == "prefetch_not_offloaded"
    v = first_violation(g, schedule([f1, ("offload", a1), f2, ("offload", a2)], 4,
                                    host_budget_bytes=M + M // 2))
    assert (v.kind, v.step, v.value_id) == ("host_budget_exceeded", 3, a2)


def test_backward_start_out_of_range():
    g, ids = chain(1)
    assert first_violation(g, schedule([("compute", ids["f1"])], 5)).kind == "bad_step"


def test_recomputation_allocates_anew_while_a_view_holds_the_old_copy():
    """a -> view(a) is kept; recomputing a allocates a second storage (as PyTorch does)."""
    g = ir.Graph()
    x = g.add_value("x", "float32", (250,), kind="user_input")
    g.add_input(x)
    a = g.add_value("a", "float32", (250,))
    v = g.add_value("a_view", "float32", (250,), alias_of=a, kind="output")
    b = g.add_value("b", "float32", (250,), kind="output")
    f = g.add_node("test.f", [x], [a], phase="forward")
    view = g.add_node("aten.alias.default", [a], [v], phase="forward")
    h = g.add_node("test.h", [a], [b], phase="backward")
    g.add_output(v, "user_output")
    g.add_output(b, "input_gradient", "x")
    sched = schedule([("compute", f), ("compute", view), ("free", a),
                      ("compute", f), ("compute", h), ("free", a)], 3)
    result = ir.check(g, sched)
    assert result.memory_during == [M, M, M, 2 * M, 3 * M, 3 * M]
    assert result.memory_after == [M, M, M, 2 * M, 3 * M, 2 * M]


def test_recomputed_user_output_keeps_the_callers_copy():
    g, ids = chain(2)
    sched = schedule([("compute", ids["f1"]), ("compute", ids["f2"]), ("compute", ids["f2"]),
                      ("compute", ids["b2"]), ("free", ids["a1"]), ("compute", ids["b1"]),
                      ("free", ids["g1"])], 3)
    result = ir.check(g, sched)
    # a2 is the output: its first copy stays with the caller after the recomputation.
    assert result.memory_after[:3] == [M, 2 * M, 3 * M]
    assert result.memory_after[-1] == 3 * M  # a2 (twice) and g0


def test_recompute_all_keeps_the_user_outputs_the_caller_holds():
    """x -> f0 -> y (returned) -> f1 -> z; backward reads z. Backward recomputes f1
    from the y the caller holds, not f0 too."""
    g = ir.Graph()
    x = g.add_value("x", "float32", (250,), kind="user_input")
    g.add_input(x)
    y = g.add_value("y", "float32", (250,), kind="output")
    z = g.add_value("z", "float32", (250,))
    out = g.add_value("out", "float32", (), kind="output")
    f0 = g.add_node("test.f0", [x], [y], phase="forward")
    f1 = g.add_node("test.f1", [y], [z], phase="forward")
    f2 = g.add_node("test.sum", [z], [out], phase="forward")
    g.add_output(y, "user_output", "y")
    g.add_output(out, "user_output", "out")
    tangent = g.add_value("tangent", "float32", (), kind="gradient")
    g.add_input(tangent, gradient_of=out)
    gz = g.add_value("gz", "float32", (250,), kind="gradient")
    g.add_node("test.b", [tangent, z], [gz], phase="backward", forward_node_id=f2)
    g.add_output(gz, "input_gradient", "z")
    sched = ir.recompute_all(g)
    backward = [s.compute for s in sched.steps[sched.backward_start:] if s.HasField("compute")]
    assert f1 in backward and f0 not in backward
    assert ir.check(g, sched).recomputations == 1
