"""What every torch-facing layer shares: the mapping between PyTorch and IR types.

Frontends (which write IR from torch programs) and runtimes (which execute IR with
torch) both import `remat_ir.torchlib.types`, never each other. It depends on
`remat_ir.ir` and torch only, so that the layers stay independent.
"""
