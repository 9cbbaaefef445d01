"""Runtimes: execute a scheduled IR graph during training (PyTorch, CPU and CUDA)."""
