"""Frontends: lower a model (PyTorch through torch.export, or ONNX) into the remat IR.

Frontends know the IR, not the solvers (docs/architecture.md, "Layers").
"""
