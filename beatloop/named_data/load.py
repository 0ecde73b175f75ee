"""Data named on the command line (``--data folder:PATH``) made into a ``DataSplit`` of
dict batches: the source named, its parameters read, its batches checked against the
recipe.

A source kind is a registered class (``beatloop.DataSource``; built-ins: ``folder``,
``npz``, the streamed ``csv``, ``parquet``, ``tfds`` and ``tfrecord``, a module each in
``beatloop/sources/``;
plugins add more through the ``register_data_sources`` hook), found by name in the
plugins' registry, with a ``name``, an attrs ``Config`` of its parameters
(set with ``--data-set NAME=VALUE``) and a ``load(seed, batch_size)`` method.
``load_data`` is what the ``run``, ``evaluate`` and ``compare`` commands call.
"""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from beatloop.core.data.batches import DataSplit
from beatloop.core.data.paths import PATH_SEPARATOR, nest_paths
from beatloop.core.data.source import DataSource, SourceConfig
from beatloop.core.failures.errors import ConfigError, DataError
from beatloop.core.schedule.config import make_config, parse_settings
from beatloop.ignored_settings import changed_settings, warn
from beatloop.named_data.identity import by_role, source_identity
from beatloop.plugins.registry import registry

if TYPE_CHECKING:
    import tensorflow as tf

#: The batch size of a source that sets none, for a recipe without a ``batch_size`` field.
DEFAULT_BATCH_SIZE = 32


def parse_source(text: str) -> tuple[str, str]:
    """``"folder:images/"`` -> ``("folder", "images/")``; the kind alone (``"ring"`` ->
    ``("ring", "")``) for a kind that reads no path (``DataSource.needs_path``)."""
    kind, sep, path = text.partition(":")
    sources = registry().sources
    if not sep and kind.strip() in sources and not sources[kind.strip()].cls.needs_path:
        return kind.strip(), ""
    if not sep or not kind.strip() or not path.strip():
        needs = f"; kind {kind.strip()!r} reads a path" if kind.strip() in sources else ""
        raise ConfigError(
            f"--data expects KIND:PATH (e.g. folder:images/ or csv:table.csv), got {text!r}"
            f"{needs}; kinds: {', '.join(registry().source_names())}"
        )
    return kind.strip(), path.strip()


def make_source(
    text: str, settings: Sequence[str] | Mapping[str, Any] = (), recipe: Any = None
) -> DataSource:
    """The source ``text`` names (``KIND:PATH``), its parameters from ``settings``
    (``["image_size=28,28"]`` or ``{"image_size": (28, 28)}``) over the ``recipe``'s
    ``source_defaults`` over the source's own defaults."""
    kind, path = parse_source(text)
    cls = registry().source(kind).cls
    owner = f"data source {kind!r}"
    for setting in () if isinstance(settings, Mapping) else settings:
        if not setting.partition("=")[0].strip() or "=" not in setting:
            raise ConfigError(f"--data-set expects NAME=VALUE, got {setting!r}")
    given = (
        dict(settings)
        if isinstance(settings, Mapping)
        else parse_settings(settings, cls.Config, owner)
    )
    fields = {field.name for field in attrs.fields(cls.Config)}
    defaults = dict(getattr(recipe, "source_defaults", {}) or {})
    values = {k: v for k, v in defaults.items() if k in fields and k not in given}
    return cls(path, make_config(cls.Config, {**values, **given}, owner))


def batch_size_for(source: DataSource, recipe: Any) -> int:
    """The source's ``batch_size``, else the recipe config's, else 32."""
    size = getattr(source.config, "batch_size", None)
    if size is None:
        size = getattr(getattr(recipe, "config", None), "batch_size", None)
    return DEFAULT_BATCH_SIZE if size is None else size


def load_data(
    source: str,
    settings: Sequence[str] | Mapping[str, Any] = (),
    *,
    recipe: Any,
    seed: int,
    validation: str | None = None,
) -> DataSplit:
    """The data ``--data SOURCE --data-set ...`` names, for ``recipe`` (a configured
    ``Recipe``), split and shuffled by ``seed``.

    ``validation`` (``--validation-data``) names a second source, read with the same
    settings, used whole and unshuffled as the validation data (the first source's
    ``validation_fraction`` must then be 0). The recipe's own ``validation_fraction``,
    when set (``--set validation_fraction=0.3``), holds out that share of a source that
    has the parameter and is not given it; where it cannot, an ``IgnoredSettingWarning``
    says why. Batches lacking keys the recipe's ``batch_keys`` needs are refused with a
    ``DataError`` naming both."""
    train_source = _with_recipe_fraction(
        make_source(source, settings, recipe), settings, recipe, validation
    )
    size = batch_size_for(train_source, recipe)
    split = nested_by_path(train_source.load(seed, size), train_source)
    _check_keys(split, train_source, recipe, "training")
    if validation is None:
        return split
    if split.validation is not None:
        raise ConfigError(
            f"--validation-data {validation} is given and data source {source!r} also holds "
            f"out validation_fraction={train_source.config.validation_fraction}; use one"
        )
    return DataSplit(split.train, load_whole(validation, settings, recipe=recipe, seed=seed))


def _with_recipe_fraction(
    source: DataSource, settings, recipe: Any, validation: str | None
) -> DataSource:
    """``source`` holding out the recipe's ``validation_fraction`` when the user set it
    (it differs from its default) and the source can; otherwise, with it set, a warning
    naming why it has no effect."""
    fraction = changed_settings(recipe).get("validation_fraction") if recipe else None
    if fraction is None:
        return source
    setting = f"--set validation_fraction={fraction}"
    given = settings if isinstance(settings, Mapping) else [s.partition("=")[0] for s in settings]
    fields = {field.name for field in attrs.fields(type(source.config))}
    if validation is not None:
        warn(f"{setting} has no effect: --validation-data {validation} gives the validation data")
    elif "validation_fraction" not in fields:
        warn(
            f"{setting} has no effect: data source kind {source.name!r} holds out no "
            "validation data (it has no validation_fraction parameter); pass --validation-data"
        )
    elif "validation_fraction" in {name.strip() for name in given}:
        held = source.config.validation_fraction
        warn(f"{setting} has no effect: --data-set validation_fraction={held} is the source's")
    else:
        return type(source)(source.path, attrs.evolve(source.config, validation_fraction=fraction))
    return source


def load_whole(
    source: str,
    settings: Sequence[str] | Mapping[str, Any] = (),
    *,
    recipe: Any,
    seed: int,
    role: str = "validation",
) -> tf.data.Dataset:
    """Every example ``source`` holds, unshuffled and none held out, in batches the size
    ``recipe`` trains with: validation data (``--validation-data``), or the data
    ``beatloop evaluate --data`` evaluates on (``role`` names it in errors)."""
    held = make_source(source, settings, recipe)
    fields = {field.name for field in attrs.fields(type(held.config))}
    whole = {k: v for k, v in (("validation_fraction", 0.0), ("shuffle", False)) if k in fields}
    held = type(held)(held.path, attrs.evolve(held.config, **whole))
    split = nested_by_path(held.load(seed, batch_size_for(held, recipe)), held)
    _check_keys(split, held, recipe, role)
    return split.train


def nested_by_path(split: DataSplit, source: DataSource) -> DataSplit:
    """``split`` with its batch keys written as paths (``x/token_ids``: a ``keys`` item
    ``token_ids:x/token_ids``, an array of that name) nested: ``x`` a dict of them, a
    model's named inputs. A split without such keys is returned as it is."""
    spec = split.train.element_spec
    if not isinstance(spec, Mapping) or not any(PATH_SEPARATOR in key for key in spec):
        return split
    try:
        layout = nest_paths({key: key for key in spec})
    except ValueError as error:
        raise DataError(f"data source {source.label!r}: {error}") from None
    nest = lambda batch: _nested(batch, layout)  # noqa: E731
    validation = split.validation
    return DataSplit(split.train.map(nest), None if validation is None else validation.map(nest))


def _nested(batch: Mapping, layout: Mapping) -> dict:
    return {
        name: _nested(batch, inner) if isinstance(inner, Mapping) else batch[inner]
        for name, inner in layout.items()
    }


def _check_keys(split: DataSplit, source: DataSource, recipe: Any, role: str) -> None:
    required = dict(getattr(recipe, "batch_keys", {}) or {})
    spec = split.train.element_spec
    missing = [key for key in required if key not in spec]
    if missing:
        raise DataError(
            f"recipe {recipe.name!r} expects batches with keys {sorted(required)}; the "
            f"{role} data source {source.label!r} gives {sorted(spec)} (missing {missing})"
            f"{source.hint(missing)}"
        )


def describe_source(cls: type[DataSource], shared: bool = True) -> list[str]:
    """``beatloop data``'s lines for one source kind: its description, then each
    parameter with its type and default; ``shared=False`` leaves out the paragraph on the
    parameters every built-in source has, for a listing of several kinds that prints it
    once (``shared_parameters``)."""
    from beatloop.core.schedule.config import config_fields, type_name

    named = f"{cls.name}:PATH" if cls.needs_path else f"{cls.name}  (it reads no path)"
    lines = [f"{cls.name}: {cls.description()}", f"  --data {named}"]
    common = inspect.getdoc(SourceConfig)
    # A Config's own docstring only: one without (a plugin's) would inherit the paragraph
    # on the shared parameters, said as if it were the kind's own.
    docs = [common] if shared and issubclass(cls.Config, SourceConfig) else []
    if cls.Config is not SourceConfig and vars(cls.Config).get("__doc__"):
        docs.append(inspect.cleandoc(vars(cls.Config)["__doc__"]))
    for doc in dict.fromkeys(docs):
        lines += _paragraph(doc, "  ")
    for field in config_fields(cls.Config):
        default = field.default
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            default = default.factory()
        said = field.metadata.get("doc")  # beatloop.setting(default, doc)'s
        lines.append(
            f"  {field.name}: {type_name(field.type)} = {default!r}"
            + (f"  ({said})" if said else "")
        )
    return lines


def shared_parameters() -> list[str]:
    """The paragraph on the parameters every built-in source has (``SourceConfig``'s),
    as ``beatloop data`` prints it once, before the kinds."""
    return _paragraph(inspect.getdoc(SourceConfig) or "", "")


def _paragraph(doc: str, indent: str) -> list[str]:
    text = " ".join(doc.replace("``", "").split())
    return textwrap.wrap(text, 88, initial_indent=indent, subsequent_indent=indent)


@attrs.frozen
class NamedData:
    """The data ``--data SOURCE --data-set ... --validation-data ...`` names, as ``fit``'s
    ``data=``: called with the recipe and the seed once both are known, and recorded in
    ``run.json`` (``data_source``) so ``run --config RUN_DIR/run.json`` reads it again."""

    source: str
    settings: tuple[str, ...] = ()
    validation: str | None = None

    def __call__(self, recipe: Any, seed: int) -> DataSplit:
        return load_data(
            self.source, self.settings, recipe=recipe, seed=seed, validation=self.validation
        )

    def identity(self, recipe: Any, recorded: Any = ()) -> list[dict[str, Any]] | None:
        """The files this data comes from, as ``run.json`` records them (``data_files``:
        each source's files with their size, modification time and fingerprint; a file
        as ``recorded`` left unread); ``None`` when a source does not say its files."""
        recorded_roles = by_role(recorded)
        identity = []
        for role, text in (("training", self.source), ("validation", self.validation)):
            if text is None:
                continue
            source = make_source(text, self.settings, recipe)
            entry = source_identity(
                source.label,
                role,
                source.path,
                source.files(),
                recorded_roles.get(role),
                source.facts(),
            )
            if entry is None:
                return None
            identity.append(entry)
        return identity

    def to_json(self) -> dict[str, Any]:
        """The ``run`` command's options that name this data, as ``run.json`` keeps them."""
        return {
            "data": self.source,
            "data_set": list(self.settings),
            "validation_data": self.validation,
        }
