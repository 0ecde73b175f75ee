"""``beatloop show RECIPE``: a recipe's config fields, quality figure, beat schedule,
supplied models, its state, the data it takes, and the variables each beat updates (each
once, as ``MODEL/PATH``)."""

from __future__ import annotations

from beatloop.cli.options import add_set_option, command_parser

NAME = "show"


def add_command(commands) -> None:
    show = command_parser(
        commands, NAME, help="a recipe's config fields, quality figure and beat schedule"
    )
    show.add_argument("recipe", help="a registered recipe name (see `beatloop list`)")
    add_set_option(show, "override a config field")


def run(args) -> int:
    import attrs

    from beatloop.core.schedule.config import config_fields, parse_settings, type_name
    from beatloop.core.schedule.phases import Phases
    from beatloop.fitting import make_recipe
    from beatloop.listing import quality_words
    from beatloop.plugins.registry import get_recipe

    cls = get_recipe(args.recipe)
    recipe = make_recipe(cls, parse_settings(args.set, cls.Config, f"recipe {cls.name!r}"))
    print(f"{cls.name}: {cls.description()}")
    print("\nconfig:")
    for field in config_fields(cls.Config):
        default = field.default
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            default = default.factory()
        value = getattr(recipe.config, field.name)
        changed = f"  (default {default!r})" if repr(value) != repr(default) else ""
        print(f"  {field.name}: {type_name(field.type)} = {value!r}{changed}")
    print(
        "\nquality figure (tune's default objective, run --keep-best quality): "
        + quality_words(cls.quality_figure)
    )
    schedule = recipe.schedule()
    phased = isinstance(schedule, Phases)  # a schedule per span of epochs
    print("\nschedule (one step of each phase):" if phased else "\nschedule (one step):")
    for line in schedule.describe().splitlines():
        print(f"  {line}")
    if cls.supplied_models:
        print("\nsupplied models (models={NAME: model or .keras path}, --model NAME=PATH.keras):")
        for name, supplied in cls.supplied_models.items():
            print(f"  {name}: {supplied.describe()}")
    state = _show_state(recipe)
    _show_data(recipe)
    _show_variables(recipe, schedule, state)
    return 0


def _show_state(recipe) -> dict:
    """The recipe's state (``Recipe.build_state``), one line per variable; returns it
    (binding's probe hands it to the losses)."""
    from beatloop.core.running.recipe import defines
    from beatloop.core.schedule.recipe_state import built_state, describe_state

    if not defines(recipe, "build_state"):
        return {}
    state = built_state(recipe, f"recipe {recipe.name!r}")
    print("\nrecipe state (models.state[NAME], in every checkpoint):")
    for line in describe_state(state) or ["(none)"]:
        print(f"  {line}")
    return state


def _show_data(recipe) -> None:
    """The batches the recipe takes, and the data source parameters it sets."""
    from beatloop.core.running.recipe import defines

    keys = ", ".join(
        f"{key} (at least {rank} dimension(s), batch first)"
        for key, rank in dict(recipe.batch_keys).items()
    )
    print("\ndata (--data KIND:PATH, see `beatloop data`):")
    print(f"  batch keys: {keys or '(any)'}")
    if recipe.source_defaults:
        settings = ", ".join(f"{k}={v}" for k, v in recipe.source_defaults.items())
        print(f"  source parameters it sets (unless --data-set sets them): {settings}")
    if defines(recipe, "default_data"):
        print("  without --data: its built-in data")
    else:
        print("  without --data: none (it has no built-in data)")


def _show_variables(recipe, schedule, state=None) -> None:
    """The variables each beat updates (and each update writes) in the recipe's default
    models, or why they cannot be shown (no built-in data, no models built, a required
    model not built); ``state``: the recipe's, which the binding probe's losses read."""
    from beatloop.core.compiled.gating import condition_methods
    from beatloop.core.compiled.phased import bind_schedule
    from beatloop.core.schedule.phases import Phases, schedules_of

    updating = any(each.updates for each in schedules_of(schedule))
    writers = " and each update writes" if updating else ""
    title = f"\nvariables each beat updates{writers} (default models):"
    lacking, models = _not_shown(recipe)
    if lacking:
        print(f"{title} not shown:")
        for line in lacking:
            print(f"  {line}")
        return
    supplied = frozenset(recipe.supplied_models)
    optimizers, losses = recipe.build_optimizers(), recipe.losses()
    bounds = bind_schedule(
        schedule, models, optimizers, losses, supplied=supplied, forwards=recipe.forwards(),
        state=state, methods=condition_methods(recipe, schedule),
    )  # fmt: skip
    print(title)
    phases = schedule.phases if isinstance(schedule, Phases) else ()
    for index, bound in enumerate(bounds):
        if phases:
            print(f"  phase {phases[index].name} ({schedule.span(index)}):")
        for line in bound.describe_variables().splitlines():
            print(f"{'    ' if phases else '  '}{line}")


def _not_shown(recipe) -> tuple[list[str], dict]:
    """Why the recipe's default models cannot be built and bound (in Python's and the
    command line's words), or no reason and the models."""
    from beatloop.core.running.recipe import defines

    lacking = []
    if not defines(recipe, "default_data"):
        lacking.append(
            "it has no built-in data (no default_data): a run passes data=... (--data KIND:PATH)"
        )
    if not defines(recipe, "build_models"):
        names = ", ".join(recipe.model_names())
        lacking.append(
            f"it builds no models (no build_models): a run passes models= with {names} "
            "(--model NAME=PATH.keras for each)"
        )
    if lacking:
        return lacking, {}
    train = recipe.default_data(0).train
    recipe.read_training_data(train)
    models = recipe.build_models(train.element_spec)
    models.update(recipe.derived_models(models))
    absent = [name for name in recipe.supplied_models if name not in models]
    if absent:
        them = "them" if len(absent) > 1 else "it"
        lacking.append(
            f"it builds no {', '.join(absent)}: a run supplies {them} (models= or --model)"
        )
    return lacking, models
