"""Solvers: choose what to keep and what to recompute under a memory budget.

Solvers read and write the IR only; none of them imports torch (DESIGN.md).
"""
