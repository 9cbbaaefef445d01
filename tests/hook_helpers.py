"""A helper in a file of its own, as a user's `utils.py`: hooks hand it their object,
and the number it reads must be compared as the hook's (tests/test_trust.py)."""


def scaled_by_t(out, box):
    return out * box.t
