"""transformers' attention masks decided as eager decides them, while torch.export traces.

transformers asks whether SDPA needs an explicit mask (`_ignore_bidirectional_mask_sdpa`,
`_ignore_causal_mask_sdpa` in `transformers.masking_utils`) and, under torch.export,
always answers yes, also where no padding mask was passed and eager's answer reads no
tensor value. Eager then calls SDPA with no mask; the trace built a (batch, 1, q, k)
mask of True and passed that. BEiT adds the mask to its relative position bias, so
every attention score got +1.0 and every gradient before it was up to 3.5e-7 off eager's;
on CUDA a mask also keeps SDPA off its flash kernel, which eager runs.

So while tracing, where no padding mask was given, the question is answered as eager
answers it (the same function with its export check off). With a padding mask eager
reads its values (is every token kept?), which one graph cannot, and transformers' traced
answer stays: README, grouped-query attention.
"""

from __future__ import annotations

import contextlib
import functools
import sys

#: transformers' functions deciding whether SDPA may run without an explicit mask.
_DECISIONS = ("_ignore_bidirectional_mask_sdpa", "_ignore_causal_mask_sdpa")


@contextlib.contextmanager
def eager_mask_decisions():
    """Within: transformers' mask decisions without a padding mask are eager's. Does
    nothing where transformers' masking module was not imported (a model without it)."""
    masking = sys.modules.get("transformers.masking_utils")
    if masking is None or not hasattr(masking, "is_torchdynamo_exporting"):
        yield
        return
    originals = {name: getattr(masking, name) for name in _DECISIONS if hasattr(masking, name)}
    for name, original in originals.items():
        setattr(masking, name, _eager_when_unpadded(masking, original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(masking, name, original)


def _eager_when_unpadded(masking, original):
    @functools.wraps(original)
    def decide(padding_mask, *args, **kwargs):
        if padding_mask is not None:
            return original(padding_mask, *args, **kwargs)
        exporting = masking.is_torchdynamo_exporting
        masking.is_torchdynamo_exporting = lambda: False
        try:
            return original(padding_mask, *args, **kwargs)
        finally:
            masking.is_torchdynamo_exporting = exporting
    return decide
