"""A user's config module holding a class whose values configure a forward, as a
`configs.py` next to the model (tests/test_handed_classes.py reads `class_configs.Setting`)."""


class Setting:
    t = 1.0
