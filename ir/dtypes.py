"""Element types: names and byte sizes, so that sizes can be checked without torch."""

from __future__ import annotations

from . import remat_ir_pb2 as pb

#: Bytes per element of each dtype (the IR's exact sizes are numel * itemsize).
ITEMSIZE: dict[int, int] = {
    pb.FLOAT32: 4, pb.FLOAT64: 8, pb.FLOAT16: 2, pb.BFLOAT16: 2,
    pb.INT8: 1, pb.INT16: 2, pb.INT32: 4, pb.INT64: 8,
    pb.UINT8: 1, pb.UINT16: 2, pb.UINT32: 4, pb.UINT64: 8,
    pb.BOOL: 1, pb.COMPLEX32: 4, pb.COMPLEX64: 8, pb.COMPLEX128: 16,
    pb.FLOAT8_E4M3FN: 1, pb.FLOAT8_E5M2: 1,
}


#: Element types that carry a gradient.
DIFFERENTIABLE = frozenset({pb.FLOAT32, pb.FLOAT64, pb.FLOAT16, pb.BFLOAT16, pb.COMPLEX64,
                            pb.COMPLEX128, pb.COMPLEX32})


def dtype_from_name(name: str | int) -> int:
    """Enum value of a dtype given as its IR name ("float32", "FLOAT32") or number."""
    if isinstance(name, int):
        if name not in ITEMSIZE:
            raise ValueError(f"unknown dtype number {name}")
        return name
    try:
        return pb.DType.Value(name.upper())
    except ValueError:
        known = ", ".join(sorted(n.lower() for n in pb.DType.keys() if n != "DTYPE_UNSPECIFIED"))
        raise ValueError(f"unknown dtype {name!r}; known dtypes: {known}") from None


def dtype_name(dtype: int) -> str:
    """Lower-case IR name of a dtype enum value ("float32")."""
    return pb.DType.Name(dtype).lower()


def numel(shape) -> int:
    """Number of elements of a tensor of this shape (1 for a scalar)."""
    n = 1
    for d in shape:
        n *= d
    return n


def nbytes(dtype: int, shape) -> int:
    """Exact bytes of a dense tensor of this dtype and shape."""
    return numel(shape) * ITEMSIZE[dtype]
