"""The `out=` overload of a functional op and back: buffer reuse rewrites a backward op
into its `out=` form (`frontends/buffer_reuse.py`), and the runtime runs the functional
form where the buffer arrives laid out otherwise than traced (`runtimes/codegen.py`)."""

from __future__ import annotations

import torch


def _signature(arguments) -> list[tuple[str, str]]:
    return [(a.name, str(a.type)) for a in arguments]


def _overloads(op: torch._ops.OpOverload):
    packet = op.overloadpacket
    return (getattr(packet, name) for name in packet.overloads())


def out_overload(op: torch._ops.OpOverload) -> tuple[torch._ops.OpOverload, str] | None:
    """The `out=` overload of a functional op and the name of its one out argument, or None:
    the overload of the same packet whose other arguments are the functional op's."""
    arguments = _signature(op._schema.arguments)
    for overload in _overloads(op):
        outs = [a.name for a in overload._schema.arguments if a.is_out]
        if len(outs) == 1 and _signature(a for a in overload._schema.arguments if not a.is_out) == arguments:
            return overload, outs[0]
    return None


def functional_overload(op: torch._ops.OpOverload) -> tuple[torch._ops.OpOverload, str] | None:
    """The functional overload of an `out=` op with one out argument, and that argument's
    name, or None: the overload of the same packet taking the others, mutating nothing."""
    outs = [a.name for a in op._schema.arguments if a.is_out]
    if len(outs) != 1:
        return None
    rest = _signature(a for a in op._schema.arguments if not a.is_out)
    found = next((overload for overload in _overloads(op) if not overload._schema.is_mutable
                  and _signature(overload._schema.arguments) == rest), None)
    return None if found is None else (found, outs[0])
