"""The hook implementations beatloop finds through this package's entry point."""

import beatloop


@beatloop.hookimpl
def register_recipes():
    from beatloop_example_plugin.wgan_gp import WganGp

    return [WganGp]


@beatloop.hookimpl
def register_callbacks():
    from beatloop_example_plugin.timer import EpochTimer

    return [EpochTimer]


@beatloop.hookimpl
def register_environments():
    from beatloop_example_plugin.grid import Grid

    return [Grid]
