"""The annealing kernel of `fastsa`: a schedule as occurrences in slots, its peak
kept exact under every move by a segment tree, compiled by numba.

Why this shape (Imanishi et al., NeurIPS 2023): a schedule is a fixed array of
`L` slots, each empty or holding one occurrence of a unit (a node, or a group
of nodes run back to back); a recomputation is one more occurrence. A move adds
an occurrence in an empty slot, removes one, or shifts one to another slot, and
is rejected when it breaks a dependency. Values live from their occurrence to
their last read before the unit's next occurrence, as in
`remat_ir.ir.from_compute_sequence`, so the peak read here is the simulator's
for the same sequence. A move changes only a few lifetimes; each is a range
add on a segment tree over the slots whose root holds the maximum, so a move
costs O(log L) per changed lifetime, not a replay of the whole schedule.

Memory is counted per *unit* of storage: one storage produced by one unit.
A unit that allocates its storage has its bytes; one whose outputs view a
storage another unit allocated has none but keeps that allocation (its
*parent*) live as long as it is read itself, as views do in the memory model
(`remat_ir.ir.memory`). Graph outputs are *pinned*: live to the end.

The arrays describing a problem are built by `fastsa.py`; this module knows
nothing of graphs. Pure Python would run tens of thousands of moves a second;
compiled, about a million.
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: The problem tuple P (built by `fastsa.build`), by position; numba reads these
#: module constants as literals. Per scheduling unit (a node or a group): its time,
#: workspace, whether its occurrences may move, whether its first run stays first;
#: CSR lists of the units it reads (IN), that read it (US), its storage units (NU)
#: and the storage units it reads (RU). Per storage unit: its scheduling unit, bytes,
#: whether it is a graph output (pinned), the storage unit it views (PARENT, -1: none)
#: and a CSR list of its readers (RD_NODE) with, for a reader that views it, the
#: reader's own storage unit (RD_CHILD, else -1).
COST = 0
WORK = 1
MOVABLE = 2
PIN_FIRST = 3
IN_PTR = 4
IN_IDX = 5
US_PTR = 6
US_IDX = 7
NU_PTR = 8
NU_IDX = 9
RU_PTR = 10
RU_IDX = 11
UNIT_NODE = 12
UNIT_BYTES = 13
UNIT_PINNED = 14
UNIT_PARENT = 15
RD_PTR = 16
RD_NODE = 17
RD_CHILD = 18
#: The state tuple S: occurrence slots per unit (sorted), their count, each storage
#: unit's end per occurrence, the slots (unit or -1), the segment tree and its pending
#: additions, and [total time].
OCC, CNT, UEND, SLOT, TREE, PENDING, TIME = 0, 1, 2, 3, 4, 5, 6

#: Most occurrences a unit may have (its first computation included), unless the start
#: sequence has more.
MAX_OCCURRENCES = 8


# ---------------------------------------------------------------- segment tree
# Leaves t[L:2L] are slots; t[p] = max(t[2p], t[2p+1]) + d[p], where d[p] is an
# addition pending on p's whole range. The root t[1] is the peak.

@njit(cache=True)
def _rebuild(t, d, p):
    while p > 1:
        p >>= 1
        a, b = t[2 * p], t[2 * p + 1]
        t[p] = (a if a > b else b) + d[p]


@njit(cache=True)
def _range_add(t, d, size, lo, hi, value):
    """Add `value` to slots lo..hi-1."""
    if lo >= hi or value == 0:
        return
    lo += size
    hi += size
    l0, r0 = lo, hi - 1
    while lo < hi:
        if lo & 1:
            t[lo] += value
            if lo < size:
                d[lo] += value
            lo += 1
        if hi & 1:
            hi -= 1
            t[hi] += value
            if hi < size:
                d[hi] += value
        lo >>= 1
        hi >>= 1
    _rebuild(t, d, l0)
    _rebuild(t, d, r0)


# -------------------------------------------------------------------- lifetimes

@njit(cache=True)
def _first_from(occ, cnt, n, pos):
    """Index of `n`'s first occurrence at or after slot `pos` (cnt[n]: none); binary
    search, as a node recomputed often has many occurrences."""
    lo, hi = 0, cnt[n]
    while lo < hi:
        mid = (lo + hi) >> 1
        if occ[n, mid] < pos:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def _current(occ, cnt, n, pos):
    """Index of `n`'s latest occurrence before slot `pos` (-1: none)."""
    return _first_from(occ, cnt, n, pos) - 1


@njit(cache=True)
def _end(u, k, P, S):
    """Last slot at which occurrence k of unit u's node is still held."""
    (cost, work, movable, pin_first, in_ptr, in_idx, us_ptr, us_idx, nu_ptr, nu_idx,
     ru_ptr, ru_idx, unit_node, unit_bytes, unit_pinned, unit_parent, rd_ptr, rd_node,
     rd_child) = P
    occ, cnt, uend, slot, t, d, acc = S
    n = unit_node[u]
    pos = occ[n, k]
    if unit_pinned[u]:
        return slot.shape[0] - 1
    nxt = occ[n, k + 1] if k + 1 < cnt[n] else slot.shape[0]
    e = pos
    for q in range(rd_ptr[u], rd_ptr[u + 1]):
        r = rd_node[q]
        c = rd_child[q]
        j = _first_from(occ, cnt, r, pos + 1)        # the reads of this occurrence start here
        if c < 0:                                    # a plain read: the last one counts
            last = _first_from(occ, cnt, r, nxt) - 1
            if last >= j and occ[r, last] > e:
                e = occ[r, last]
            continue
        while j < cnt[r] and occ[r, j] < nxt:        # a view: held as long as it is
            if uend[c, j] > e:
                e = uend[c, j]
            j += 1
    return e


@njit(cache=True)
def _set_end(u, k, e, P, S):
    """Move the end of occurrence k of unit u to `e` (pos - 1: not held)."""
    occ, cnt, uend, slot, t, d, acc = S
    unit_bytes = P[UNIT_BYTES]
    old = uend[u, k]
    if old == e:
        return False
    b = unit_bytes[u]
    size = slot.shape[0]
    if e > old:
        _range_add(t, d, size, old + 1, e + 1, b)
    else:
        _range_add(t, d, size, e + 1, old + 1, -b)
    uend[u, k] = e
    return True


@njit(cache=True)
def _refresh(u, k, P, S):
    """Recompute a lifetime, and those of the allocations it holds through views."""
    occ, cnt = S[OCC], S[CNT]
    unit_node, unit_parent = P[UNIT_NODE], P[UNIT_PARENT]
    while True:
        if not _set_end(u, k, _end(u, k, P, S), P, S):
            return
        parent = unit_parent[u]
        if parent < 0:
            return
        j = _current(occ, cnt, unit_node[parent], occ[unit_node[u], k])
        if j < 0:
            return
        u, k = parent, j


@njit(cache=True)
def _refresh_inputs(n, pos, P, S):
    """Lifetimes of what the node at `pos` reads (a read appeared or went)."""
    occ, cnt = S[OCC], S[CNT]
    ru_ptr, ru_idx, unit_node = P[RU_PTR], P[RU_IDX], P[UNIT_NODE]
    for q in range(ru_ptr[n], ru_ptr[n + 1]):
        v = ru_idx[q]
        j = _current(occ, cnt, unit_node[v], pos)
        if j >= 0:
            _refresh(v, j, P, S)


# ------------------------------------------------------------------------ moves

@njit(cache=True)
def can_insert(n, s, P, S):
    occ, cnt, slot = S[OCC], S[CNT], S[SLOT]
    pin_first, in_ptr, in_idx = P[PIN_FIRST], P[IN_PTR], P[IN_IDX]
    if slot[s] >= 0 or cnt[n] >= occ.shape[1]:
        return False
    if pin_first[n] and (cnt[n] == 0 or s < occ[n, 0]):
        return False
    for q in range(in_ptr[n], in_ptr[n + 1]):
        i = in_idx[q]
        if cnt[i] == 0 or occ[i, 0] >= s:
            return False
    return True


@njit(cache=True)
def insert(n, s, P, S):
    """Add an occurrence of `n` at empty slot `s` (checked by `can_insert`)."""
    occ, cnt, uend, slot, t, d, acc = S
    cost, work, nu_ptr, nu_idx = P[COST], P[WORK], P[NU_PTR], P[NU_IDX]
    k = _first_from(occ, cnt, n, s)
    for j in range(cnt[n], k, -1):
        occ[n, j] = occ[n, j - 1]
        for q in range(nu_ptr[n], nu_ptr[n + 1]):
            uend[nu_idx[q], j] = uend[nu_idx[q], j - 1]
    occ[n, k] = s
    cnt[n] += 1
    slot[s] = n
    for q in range(nu_ptr[n], nu_ptr[n + 1]):
        uend[nu_idx[q], k] = s - 1
    for q in range(nu_ptr[n], nu_ptr[n + 1]):
        _refresh(nu_idx[q], k, P, S)
    if k > 0:
        for q in range(nu_ptr[n], nu_ptr[n + 1]):
            _refresh(nu_idx[q], k - 1, P, S)
    _refresh_inputs(n, s, P, S)
    _range_add(t, d, slot.shape[0], s, s + 1, work[n])
    acc[0] += cost[n]


@njit(cache=True)
def can_remove(n, k, P, S):
    occ, cnt = S[OCC], S[CNT]
    pin_first, us_ptr, us_idx = P[PIN_FIRST], P[US_PTR], P[US_IDX]
    if cnt[n] < 2:
        return False
    if k > 0:
        return True
    if pin_first[n]:
        return False
    lo, hi = occ[n, 0], occ[n, 1]
    for q in range(us_ptr[n], us_ptr[n + 1]):
        r = us_idx[q]
        for j in range(cnt[r]):
            if lo < occ[r, j] < hi:
                return False
    return True


@njit(cache=True)
def remove(n, k, P, S):
    """Remove occurrence k of `n` (checked by `can_remove`)."""
    occ, cnt, uend, slot, t, d, acc = S
    cost, work, nu_ptr, nu_idx = P[COST], P[WORK], P[NU_PTR], P[NU_IDX]
    s = occ[n, k]
    for q in range(nu_ptr[n], nu_ptr[n + 1]):
        _set_end(nu_idx[q], k, s - 1, P, S)
    for j in range(k, cnt[n] - 1):
        occ[n, j] = occ[n, j + 1]
        for q in range(nu_ptr[n], nu_ptr[n + 1]):
            uend[nu_idx[q], j] = uend[nu_idx[q], j + 1]
    cnt[n] -= 1
    slot[s] = -1
    if k > 0:
        for q in range(nu_ptr[n], nu_ptr[n + 1]):
            _refresh(nu_idx[q], k - 1, P, S)
    _refresh_inputs(n, s, P, S)
    _range_add(t, d, slot.shape[0], s, s + 1, -work[n])
    acc[0] -= cost[n]


@njit(cache=True)
def _index_at(occ, cnt, n, s):
    j = _first_from(occ, cnt, n, s)
    return j if j < cnt[n] and occ[n, j] == s else -1


# ---------------------------------------------------------------------- the loop

@njit(cache=True)
def seed(value):
    np.random.seed(value)


@njit(cache=True)
def objective(peak, seconds, budget, weight):
    """time x (max(budget, peak) / budget) ** weight: weight 1 is the paper's
    max(budget, peak) x time (scaled); a larger weight prices an excess higher."""
    excess = peak / budget if peak > budget else 1.0
    return seconds * excess ** weight


@njit(cache=True)
def anneal(P, S, candidates, iterations, start, total, t_first, t_last, budget, weight,
           stop_when_fits):
    """Run `iterations` moves (numbers `start`.. of `total`, which set the
    geometric temperature between `t_first` and `t_last`). Objective:
    `objective`. Returns (moves tried, moves accepted)."""
    occ, cnt, uend, slot, t, d, acc = S
    us_ptr, us_idx = P[US_PTR], P[US_IDX]
    size = slot.shape[0]
    peak = t[1]
    current = objective(peak, acc[0], budget, weight)
    ratio = t_last / t_first
    accepted = 0
    log_size = 1                               # randint(0) raises: one slot draws from 1
    while (1 << log_size) < size:
        log_size += 1
    chain_slots = np.empty(32, dtype=np.int64)
    done = 0
    for it in range(iterations):
        done += 1
        if stop_when_fits and t[1] <= budget:
            break
        temperature = t_first * ratio ** ((start + it) / total)
        n = candidates[np.random.randint(candidates.shape[0])]
        kind = np.random.randint(3)
        undo_insert, undo_remove = -1, -1      # slots to undo by removing / re-inserting
        chained = 0
        if kind == 0:                          # add a recomputation
            if np.random.random() < 0.75 and us_ptr[n + 1] > us_ptr[n]:
                r = us_idx[us_ptr[n] + np.random.randint(us_ptr[n + 1] - us_ptr[n])]
                if cnt[r] == 0:
                    continue
                p = occ[r, np.random.randint(cnt[r])]
                s = p - 1 - np.random.randint(1 << np.random.randint(log_size))
            else:
                s = np.random.randint(size)
            if s < 0 or not can_insert(n, s, P, S):
                continue
            insert(n, s, P, S)
            undo_insert = s
            if np.random.random() < 0.5:       # and what it reads, recomputed just before
                chained = _chain(n, s, 1 + np.random.randint(1 << np.random.randint(5)),
                                 chain_slots, P, S)
        elif cnt[n] == 0:                      # nothing to drop or shift (a candidate
            continue                           # the state never runs)
        elif kind == 1:                        # drop one occurrence
            k = np.random.randint(cnt[n])
            if not can_remove(n, k, P, S):
                continue
            undo_remove = occ[n, k]
            remove(n, k, P, S)
        else:                                  # shift one occurrence
            k = np.random.randint(cnt[n])
            old = occ[n, k]
            step = 1 + np.random.randint(1 << np.random.randint(log_size))
            s = old + step if np.random.random() < 0.5 else old - step
            if s < 0 or s >= size or not can_insert(n, s, P, S):
                continue
            insert(n, s, P, S)
            k = _index_at(occ, cnt, n, old)
            if not can_remove(n, k, P, S):
                remove(n, _index_at(occ, cnt, n, s), P, S)
                continue
            remove(n, k, P, S)
            undo_insert, undo_remove = s, old
        peak = t[1]
        candidate = objective(peak, acc[0], budget, weight)
        delta = candidate - current
        if delta <= 0 or np.random.random() < np.exp(-delta / temperature):
            current = candidate
            accepted += 1
            continue
        for c in range(chained - 1, -1, -1):
            m = slot[chain_slots[c]]
            remove(m, _index_at(occ, cnt, m, chain_slots[c]), P, S)
        if undo_remove >= 0:
            insert(n, undo_remove, P, S)
        if undo_insert >= 0:
            remove(n, _index_at(occ, cnt, n, undo_insert), P, S)
    return done, accepted


@njit(cache=True)
def _chain(n, s, size, chain_slots, P, S):
    """Recompute, before the occurrence of `n` at slot `s`, what it reads, and what
    that reads, ... (each input with probability 3/4, up to `size` nodes), each
    in the nearest empty slot below the last one placed, so every node lands
    before its readers. The multi-node move lets a recomputation read fresh copies
    so that the old ones can die: one node at a time, each step would cost time
    without lowering the peak. Returns how many were inserted (their slots in
    `chain_slots`, in insertion order)."""
    slot = S[SLOT]
    movable, in_ptr, in_idx = P[MOVABLE], P[IN_PTR], P[IN_IDX]
    size = min(size, chain_slots.shape[0])
    done = 0
    lowest = s
    head = -1                      # chain_slots[head] is the node whose inputs come next
    current = n
    while done < size:
        for q in range(in_ptr[current], in_ptr[current + 1]):
            if done >= size:
                break
            i = in_idx[q]
            if not movable[i] or np.random.random() < 0.25:
                continue
            fresh = False
            for c in range(done):
                if slot[chain_slots[c]] == i:
                    fresh = True
            if fresh:
                continue
            s2 = lowest - 1
            while s2 >= 0 and s2 > lowest - 64 and slot[s2] >= 0:
                s2 -= 1
            if s2 < 0 or slot[s2] >= 0 or not can_insert(i, s2, P, S):
                continue
            insert(i, s2, P, S)
            chain_slots[done] = s2
            done += 1
            lowest = s2
        head += 1
        if head >= done:
            break
        current = slot[chain_slots[head]]
    return done


# ------------------------------------------------------------------------- state

def new_state(problem, size: int, placement):
    """State with the occurrences `placement` (unit, slot) pairs, in slot order."""
    n_units = problem[0].shape[0]
    n_storage = problem[12].shape[0]
    counts = np.bincount([u for u, _ in placement], minlength=n_units)
    most = max(MAX_OCCURRENCES, int(counts.max(initial=0)) + 2)
    occ = np.zeros((n_units, most), dtype=np.int64)
    cnt = np.zeros(n_units, dtype=np.int64)
    uend = np.zeros((n_storage, most), dtype=np.int64)
    slot = np.full(size, -1, dtype=np.int64)
    t = np.zeros(2 * size, dtype=np.int64)
    d = np.zeros(2 * size, dtype=np.int64)
    acc = np.zeros(1, dtype=np.float64)
    state = (occ, cnt, uend, slot, t, d, acc)
    _place(problem, state, np.asarray([u for u, _ in placement], dtype=np.int64),
           np.asarray([s for _, s in placement], dtype=np.int64))
    return state


@njit(cache=True)
def _place(P, S, units, slots):
    for i in range(units.shape[0]):
        insert(units[i], slots[i], P, S)


def sequence(state) -> list[int]:
    """The occurrences in slot order."""
    slot = state[3]
    return [int(u) for u in slot[slot >= 0]]
