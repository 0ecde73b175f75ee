"""The Recipe base class: what a training step is, declared once per kind of training.

A recipe builds its models and optimizers, defines its losses, and returns its beat
schedule; the engine does everything else. Subclasses set ``name`` and ``Config`` and
implement the abstract parts; registration checks that they did. ``default_data`` and
``build_models`` are optional: a run that passes ``data=`` and ``models=`` needs neither.
"""

from __future__ import annotations

import abc
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import attrs
import keras
import tensorflow as tf

from beatloop.core.compiled.forward import ModelCalls
from beatloop.core.compiled.user_code import user_frame
from beatloop.core.data.batches import DataSplit
from beatloop.core.events.callbacks import Callback, Order
from beatloop.core.events.run import Run
from beatloop.core.failures.errors import BeatloopError, ConfigError, UserCodeError
from beatloop.core.schedule.beats import Schedule
from beatloop.core.schedule.phases import Phases
from beatloop.core.schedule.supplied import SuppliedModel, model_names, no_models_message

LossOutput = tf.Tensor | Mapping[str, tf.Tensor]
LossFn = Callable[[ModelCalls, Mapping[str, tf.Tensor]], LossOutput]
ForwardFn = Callable[[ModelCalls, Mapping[str, tf.Tensor]], Any]


@attrs.frozen
class NoConfig:
    """Config of a recipe with nothing to configure."""


class Recipe(abc.ABC):
    """Base class of every recipe. One instance is one configured run's recipe.

    Subclasses define:

    - ``name``: the registry name; ``Config``: an attrs frozen class of its settings;
    - ``build_optimizers()``: optimizers by name;
    - ``losses()``: loss functions by name; each takes ``(models, batch)`` and returns a
      scalar, or a dict with the scalar under ``"loss"`` and any outputs metrics need
      (a beat in a ``Group`` takes ``(outputs, batch)``:
      the outputs of its group's forward, from ``forwards()``);
    - ``schedule()``: the ``Schedule`` of one step (or ``Phases``: a schedule per span
      of epochs).

    Optional: ``default_data(seed)`` (a ``DataSplit`` built from data that ships
    locally; without it every run passes ``data=``), ``build_models(batch_spec)`` (models
    by name, built for batches of that spec; without it every run passes ``models=``),
    ``derived_models(models)`` (models made from the others: a copy an average starts as),
    ``read_training_data(train)`` (vocabularies and counts ``build_models`` needs),
    ``build_state()`` (variables that are not models, see ``Recipe.build_state``),
    ``steps_per_epoch`` (for data its own loop makes, see ``beatloop.loop_data``),
    ``supplied_models`` (models the user supplies, see ``SuppliedModel``),
    ``batch_keys`` (key -> minimum rank), ``nested_keys`` (the keys that may hold a dict
    or tuple of tensors: ``x`` by default), ``primary_model`` (the model Keras callbacks
    see), ``source_defaults`` (data source parameters it wants, see
    ``beatloop.DataSource``), ``label_classes()`` (label keys -> the config
    field giving their number of classes), ``quality_figure``, ``build_metrics()`` and
    ``update_metrics()``, ``check_batch_spec()``, ``inference_models()``, and the
    recipe's end-of-epoch work: ``callbacks()``, with ``epoch_figures()`` as the shorthand
    for figures logged with each epoch.

    An exception a subclass's ``default_data``, ``read_training_data``, ``build_models``,
    ``build_state`` or ``epoch_figures`` raises reaches the user as a ``UserCodeError``
    naming the recipe, the method and its line (``REPORTED``); beatloop's own errors
    raised there pass unchanged.
    """

    name: ClassVar[str] = ""
    Config: ClassVar[type] = NoConfig
    batch_keys: ClassVar[Mapping[str, int]] = {}
    #: The batch keys that may hold a dict or tuple of tensors (a model's named inputs,
    #: as Keras's ``fit`` takes ``x``): keys the recipe only hands to its models. Every
    #: other key must hold one tensor (the recipe computes on it: a label, an image it
    #: augments), and data giving a structure there is refused naming the key.
    nested_keys: ClassVar[frozenset[str]] = frozenset({"x"})
    #: The logged figure that says how good a run's result is, and whether higher is
    #: better (``beatloop compare`` puts it in its table): ``"val_accuracy:max"`` or
    #: ``("val_accuracy", "max")`` (a subclass's string is made that pair); none by default.
    quality_figure: ClassVar[tuple[str, str] | None] = None
    #: Models the user supplies (a trained teacher, a pretrained feature network), by
    #: name: required unless ``build_models`` builds a declared fallback; frozen unless a
    #: beat updates them.
    supplied_models: ClassVar[Mapping[str, SuppliedModel]] = {}
    #: The model a Keras callback sees as ``self.model`` unless told otherwise (with the
    #: optimizer of the beat that updates it); ``None``: the one model the beats update.
    primary_model: ClassVar[str | None] = None
    #: Parameter defaults this recipe wants from a data source named on the command line
    #: (``--data``), applied to the sources that have the parameter unless the user sets
    #: it: the gan's ``{"value_range": "signed"}`` has a folder's pixels in [-1, 1].
    source_defaults: ClassVar[Mapping[str, Any]] = {}
    #: Whether AutoGraph converts the recipe's losses, forwards and metric update when
    #: they are traced (their Python ``if``/``for`` on tensors become graph control
    #: flow). ``False``: they are traced as written, which starts a run sooner; for a
    #: recipe whose Python control flow never depends on a tensor's value.
    autograph: ClassVar[bool] = True
    #: Steps in one epoch when the run passes no ``steps_per_epoch``: what a recipe whose
    #: data its own loop makes (``beatloop.loop_data()``, endless) sets; ``None`` (the
    #: default): an epoch is one pass over the training data.
    steps_per_epoch: ClassVar[int | None] = None

    def __init__(self, config: Any = None):
        self.config = self.Config() if config is None else config

    def __init_subclass__(cls, **kwargs):
        """A subclass's own methods of ``REPORTED`` report what they raise; its
        ``quality_figure`` written ``"FIGURE:MODE"`` becomes the pair every reader takes
        (a form neither way is left for registration to refuse: ``quality_problem``)."""
        super().__init_subclass__(**kwargs)
        quality = vars(cls).get("quality_figure")
        if isinstance(quality, str) and quality_problem(quality) is None:
            cls.quality_figure = tuple(quality.split(":"))
        for method in REPORTED:
            function = vars(cls).get(method)
            # The base class's own (a subclass undoing a parent's) stays itself: unwrapped.
            if inspect.isfunction(function) and function is not vars(Recipe).get(method):
                setattr(cls, method, _reported(function, method))

    @classmethod
    def description(cls) -> str:
        """The first line of the class docstring: what ``beatloop list`` shows."""
        doc = inspect.getdoc(cls) or ""
        return doc.strip().splitlines()[0] if doc.strip() else ""

    def default_data(self, seed: int) -> DataSplit:
        """Training and validation data for a run that passes none. Optional: a recipe
        without it is run with ``data=``."""
        raise ConfigError(
            f"recipe {self.name!r} has no built-in data (it defines no default_data): pass data=..."
        )

    def build_models(self, batch_spec: Mapping[str, tf.TensorSpec]) -> dict[str, keras.Layer]:
        """Create this recipe's models for batches of ``batch_spec``. Optional: a recipe
        without it is run with ``models=`` holding every model its schedule names."""
        raise ConfigError(no_models_message(f"recipe {self.name!r}", self.model_names()))

    def derived_models(self, models: Mapping[str, keras.Layer]) -> dict[str, keras.Layer]:
        """Models made from the run's others (an average or a target network that starts
        as a copy: ``beatloop.layers.copy_of``), by name, given ``models``: the built and
        passed ones, so a copy is of the model the run trains, the user's included. A
        name the user passes is the user's. None by default."""
        return {}

    def read_training_data(self, train: tf.data.Dataset) -> None:
        """Read what ``build_models`` needs from the training data (vocabularies, counts)
        once, just before it is called; nothing by default. A run rebuilt to resume,
        evaluate or export calls it again on the same data, so what it reads must not
        depend on the data's order (one more pass: a reshuffling pipeline is on its next
        order afterwards, the same in every rebuild)."""
        return None

    def build_state(self) -> dict[str, tf.Variable] | None:
        """The recipe's state that is not a model (a replay buffer, environment state,
        running statistics): non-trainable variables by name, built once in the
        strategy's scope after the models, reached as ``models.state[name]`` in losses,
        forwards, updates and acts, and written in every checkpoint. By default none:
        ``{}`` (returning ``None`` means the same)."""
        return {}

    def model_names(self) -> tuple[str, ...]:
        """The model names this recipe uses: its schedule's selectors, its beats'
        ``training`` models and its supplied models."""
        return model_names(self.schedule(), self.supplied_models)

    @abc.abstractmethod
    def build_optimizers(self) -> dict[str, keras.optimizers.Optimizer]:
        """Create this recipe's optimizers (unbuilt: the engine builds them at bind)."""

    @abc.abstractmethod
    def losses(self) -> dict[str, LossFn]:
        """Loss functions by the names the schedule's beats use."""

    @abc.abstractmethod
    def schedule(self) -> Schedule | Phases:
        """The beats of one training step (``Phases``: each span of epochs' own)."""

    def forwards(self) -> dict[str, ForwardFn]:
        """Forward functions by the names the schedule's groups use: each takes
        ``(models, batch)`` and returns the outputs its group's losses take as
        ``(outputs, batch)``. None by default."""
        return {}

    def build_metrics(self) -> dict[str, keras.metrics.Metric]:
        """Metrics updated each step (and, as separate instances, each validation step)."""
        return {}

    def update_metrics(
        self,
        metrics: Mapping[str, keras.metrics.Metric],
        batch: Mapping[str, tf.Tensor],
        outputs: Mapping[str, Mapping[str, tf.Tensor]],
    ) -> None:
        """Update ``metrics`` from a batch and each beat's outputs (by beat name). The
        default updates nothing (it has a statement: AutoGraph cannot convert a function
        whose body is a docstring alone, and would warn)."""
        return None

    def check_batch_spec(self, spec: Mapping[str, tf.TensorSpec]) -> list[str]:
        """Recipe-specific problems with a batch spec, beyond ``batch_keys``."""
        return []

    def label_classes(self) -> Mapping[str, str]:
        """The batch keys that hold class labels, each mapped to the name of the config
        field that gives its number of classes (``{"y": "classes"}``); none by default.

        Read only when a step fails on a label outside ``[0, classes)``: the error then
        names the label, the key and the field (and what to set it to). A step holds no
        op for it."""
        return {}

    def epoch_figures(self, run: Run) -> Mapping[str, float]:
        """Figures computed eagerly at each epoch's end, after validation, and logged
        with the epoch (e.g. a sample-quality score); none by default. A shorthand for a
        callback of order ``Order.FIGURES`` that adds them to the epoch's logs."""
        return {}

    def inference_models(self, models: Mapping[str, keras.Layer]) -> dict[str, keras.Model]:
        """The trained models a user keeps, by name: what ``FitResult.export`` writes.
        None by default."""
        return {}

    def callbacks(self) -> list[Callback]:
        """Callbacks this recipe adds to every run of it (e.g. one that saves samples);
        hand them the recipe (``SampleGrid(self)``) rather than reading ``run.recipe``."""
        return []


def quality_problem(quality: object) -> str | None:
    """What is wrong with a ``quality_figure`` (``None``: nothing): it is ``None``,
    ``"FIGURE:min"``/``"FIGURE:max"`` or the pair ``("FIGURE", "min"/"max")``."""
    pair = quality.split(":") if isinstance(quality, str) else quality
    if quality is None or (
        isinstance(pair, tuple | list)
        and len(pair) == 2
        and all(isinstance(part, str) for part in pair)
        and pair[0].strip() == pair[0] != ""
        and pair[1] in ("min", "max")
    ):
        return None
    return (
        "its quality_figure must be 'FIGURE:min' or 'FIGURE:max' (or the pair "
        f"('FIGURE', 'max')), found {quality!r}"
    )


#: A recipe's methods called outside any step (those that build a run's parts, and its
#: epoch figures): an exception one raises (beatloop's own errors aside: a recipe's
#: ``ConfigError`` stays one) becomes a ``UserCodeError`` naming the recipe, the method
#: and its line, as a loss's does.
REPORTED = (
    "default_data", "read_training_data", "build_models", "derived_models", "build_state",
    "epoch_figures",
)  # fmt: skip


def _reported(function: Callable, method: str) -> Callable:
    """``function`` (a recipe's ``method``) with its exceptions reported."""

    @functools.wraps(function)
    def reported(self, *args, **kwargs):
        try:
            return function(self, *args, **kwargs)
        except BeatloopError:
            raise
        except Exception as error:
            raise UserCodeError(
                f"{method}()", error, recipe=f"recipe {self.name!r}", at=user_frame(error)
            ) from error

    return reported


class EpochFigures(Callback):
    """Logs a recipe's ``Recipe.epoch_figures`` with each epoch, before any other
    callback sees the epoch's logs; a figure named as one the run logs itself (a beat's
    loss, its ``<beat>_updates`` count, a metric) is refused rather than replacing it."""

    order = Order.FIGURES

    def __init__(self, recipe: Recipe):
        self.recipe = recipe

    def on_epoch_end(self, run: Run, epoch: int, logs: dict[str, float]) -> None:
        figures = self.recipe.epoch_figures(run)
        if taken := sorted(set(figures) & set(logs)):
            names = ", ".join(repr(name) for name in taken)
            raise ConfigError(
                f"recipe {self.recipe.name!r}: epoch_figures() returns {names}, which the run "
                f"logs itself ({_whose(taken[0])}); give the recipe's figure another "
                "name, so neither replaces the other"
            )
        logs.update(figures)


def _whose(figure: str) -> str:
    """What the run's own figure ``figure`` is, in words."""
    if figure.endswith("_updates"):
        return f"the number of updates {figure.removesuffix('_updates')!r} made in the epoch"
    return "a loss or a metric of the epoch"


def defines(recipe: Recipe | type[Recipe], method: str) -> bool:
    """Whether ``recipe`` (an instance or a class) defines ``method`` itself rather than
    inheriting ``Recipe``'s (e.g. the optional ``default_data``, ``build_models``)."""
    cls = recipe if isinstance(recipe, type) else type(recipe)
    return getattr(cls, method) is not getattr(Recipe, method)


def label_settings(recipe: Recipe) -> dict[str, tuple[str, object]]:
    """The recipe's label keys (``Recipe.label_classes``), each with its config
    field and that field's value in this recipe's config."""
    return {
        key: (field, getattr(recipe.config, field, None))
        for key, field in recipe.label_classes().items()
    }


def recipe_callbacks(recipe: Recipe) -> list[Callback]:
    """A recipe's end-of-epoch work, as callbacks: its figures (when it defines
    ``epoch_figures``) and its own ``callbacks()``."""
    figures = defines(recipe, "epoch_figures")
    return [*([EpochFigures(recipe)] if figures else []), *recipe.callbacks()]
