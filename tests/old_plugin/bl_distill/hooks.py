"""The hook implementations beatloop finds through this package's ``distill`` entry point
(docs/plugins.md at beatloop 0.1.0: "Hooks", "The entry point")."""

import beatloop


@beatloop.hookimpl
def register_recipes():
    from bl_distill.distill import Distill

    return [Distill]


@beatloop.hookimpl
def register_callbacks():
    from bl_distill.gap import DistillGap

    return [DistillGap]
