"""A study's search space: ``NAME=log:A:B``, ``NAME=float:A:B``, ``NAME=int:A:B`` or
``NAME=choice:X,Y`` per recipe config field, checked against the recipe's config (the
field exists, its type fits the kind, every end of a range and every choice passes the
field's validators) before the first trial runs."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from beatloop.core.failures.errors import ConfigError, did_you_mean
from beatloop.core.schedule.config import config_fields, make_config, parse_settings, type_name

#: The kinds of a dimension, as written before the first colon.
KINDS = ("log", "float", "int", "choice")


@attrs.frozen
class Dimension:
    """One config field searched: ``kind`` is one of ``KINDS``; ``low`` and ``high``
    bound a range (both ends included), ``choices`` list a ``choice``'s values."""

    name: str
    kind: str = attrs.field(validator=attrs.validators.in_(KINDS))
    low: float | int | None = None
    high: float | int | None = None
    choices: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        """The dimension as ``--space`` writes it."""
        if self.kind == "choice":
            return f"{self.name}=choice:{','.join(map(str, self.choices))}"
        return f"{self.name}={self.kind}:{self.low}:{self.high}"

    def distribution(self):
        """The Optuna distribution this dimension samples from."""
        import optuna

        if self.kind == "choice":
            return optuna.distributions.CategoricalDistribution(list(self.choices))
        if self.kind == "int":
            return optuna.distributions.IntDistribution(int(self.low), int(self.high))
        return optuna.distributions.FloatDistribution(
            float(self.low), float(self.high), log=self.kind == "log"
        )


@attrs.frozen
class Space:
    """The searched fields of one recipe's config, in the order given."""

    dimensions: tuple[Dimension, ...]

    @property
    def texts(self) -> list[str]:
        return [d.text for d in self.dimensions]

    def distributions(self) -> dict[str, Any]:
        return {d.name: d.distribution() for d in self.dimensions}

    def overrides(self, params: Mapping[str, Any], config_cls: type, owner: str) -> dict:
        """A trial's ``params`` as config overrides: choices parsed by the field's type."""
        texts = [f"{d.name}={params[d.name]}" for d in self.dimensions if d.kind == "choice"]
        values = {d.name: params[d.name] for d in self.dimensions if d.kind != "choice"}
        return {**values, **parse_settings(texts, config_cls, owner)}


def parse_space(texts: Iterable[str], config_cls: type, owner: str,
                fixed: Mapping[str, Any] | None = None) -> Space:  # fmt: skip
    """``["learning_rate=log:1e-4:1e-1", "hidden=int:16:256"]`` as a ``Space`` of
    ``config_cls``'s fields; a ``ConfigError`` naming each bad one. ``fixed`` are the
    config overrides every trial shares (``--set``), which a dimension may not repeat."""
    fields = {f.name: f for f in config_fields(config_cls)}
    dimensions, problems = [], []
    for text in texts:
        try:
            dimensions.append(_dimension(text, fields, config_cls, owner, dict(fixed or {})))
        except ConfigError as error:
            problems.append(str(error))
    names = [d.name for d in dimensions]
    problems += [
        f"--space {n} is given twice" for n in sorted({n for n in names if names.count(n) > 1})
    ]
    if fixed:
        problems += [
            f"--space {n} is also fixed by --set {n}=...; drop one" for n in names if n in fixed
        ]
    if problems:
        raise ConfigError("; ".join(problems))
    if not dimensions:
        raise ConfigError("name at least one --space FIELD=KIND:... to search")
    return Space(tuple(dimensions))


def _dimension(text: str, fields, config_cls, owner: str, fixed: dict) -> Dimension:
    name, sep, spec = text.partition("=")
    name = name.strip()
    kind, _, rest = spec.partition(":")
    kind = kind.strip()
    if not sep or not name or not rest:
        raise ConfigError(
            f"--space expects FIELD=KIND:..., e.g. learning_rate=log:1e-4:1e-1, "
            f"hidden=int:16:256 or optimizer=choice:adam,sgd; got {text!r}"
        )
    field = fields.get(name)
    if field is None:
        raise ConfigError(
            f"--space {name}: {owner} has no config field {name!r}{did_you_mean(name, fields)}; "
            f"fields: {', '.join(fields)}"
        )
    if kind not in KINDS:
        raise ConfigError(
            f"--space {name}: unknown kind {kind!r}{did_you_mean(kind, KINDS)}; "
            f"kinds: {', '.join(KINDS)}"
        )
    if kind == "choice":
        values = tuple(v.strip() for v in rest.split(",") if v.strip())
        if not values:
            raise ConfigError(f"--space {name}=choice: needs at least one value")
        for value in values:  # kept as text: Optuna stores it, ``overrides`` parses it
            _parsed(name, value, config_cls, owner, fixed)
        return Dimension(name, kind, choices=values)
    ends = rest.split(":")
    if len(ends) != 2:
        raise ConfigError(f"--space {name}={kind}: expects two ends LOW:HIGH, got {rest!r}")
    wanted = int if kind == "int" else float
    accepted = (int,) if kind == "int" else (int, float)
    base = [o for o in _options(field.type) if o is not type(None)]
    if not any(o in accepted for o in base):
        raise ConfigError(
            f"--space {name}={kind}: config field {name!r} is {type_name(field.type)}, "
            f"not a number{' (use choice:...)' if base else ''}"
        )
    if kind != "int" and float not in base:
        raise ConfigError(f"--space {name}={kind}: config field {name!r} is int: use int:LOW:HIGH")
    try:
        low, high = (wanted(e) for e in ends)
    except ValueError:
        raise ConfigError(
            f"--space {name}={kind}: the ends must be {wanted.__name__}s, got {rest!r}"
        ) from None
    if not all(math.isfinite(end) for end in (low, high)):
        raise ConfigError(
            f"--space {name}={kind}: both ends must be finite numbers (a sampler cannot draw "
            f"from an endless range), got {rest!r}"
        )
    if not low < high:
        raise ConfigError(f"--space {name}={kind}: LOW must be below HIGH, got {low} and {high}")
    if kind == "log" and low <= 0:
        raise ConfigError(f"--space {name}=log: both ends must be above 0, got {low}")
    for end in (low, high):  # the field's validators judge each end
        _checked(name, end, config_cls, owner, fixed)
    return Dimension(name, kind, low, high)


def _options(annotation) -> tuple:
    import typing

    args = typing.get_args(annotation)
    return args if args and typing.get_origin(annotation) is not tuple else (annotation,)


def _parsed(name: str, text: str, config_cls, owner: str, fixed: dict) -> Any:
    try:
        value = parse_settings([f"{name}={text}"], config_cls, owner)[name]
    except ConfigError as error:
        raise ConfigError(f"--space {name}: {text!r} is not a valid value: {error}") from None
    return _checked(name, value, config_cls, owner, fixed)


def _checked(name: str, value: Any, config_cls, owner: str, fixed: dict) -> Any:
    try:
        make_config(config_cls, {**fixed, name: value}, owner)
    except ConfigError as error:
        raise ConfigError(f"--space {name}: {value!r} is not a valid value: {error}") from None
    return value
