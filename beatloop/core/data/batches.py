"""Data sets as the engine sees them: batched ``tf.data`` pipelines of dicts of tensors.

A user may pass ``(x, y)`` tuples or dicts; both become dicts here, once, so recipes and
the compiled step see one shape of batch. A batch key may hold a dict or tuple of tensors
(a model's named inputs, as Keras's ``fit`` takes ``x``): each tensor in it is named by
its path (``paths.py``). Checks run on the element spec, before any tracing, so a
mistake reads as a sentence rather than a TensorFlow traceback.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import attrs
import tensorflow as tf

from beatloop.core.data.paths import first_tensor, is_nested, spec_paths
from beatloop.core.failures.errors import DataError
from beatloop.core.failures.fields import one_line_frozen

TUPLE_KEYS = ("x", "y", "sample_weight")

#: Each data set ``as_dict_batches`` made with a map (tuples to dicts: the same rows),
#: to the data set it mapped: TensorFlow cannot see a batch size through a map.
_MAPPED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@one_line_frozen
class DataSplit:
    """A training data set and an optional validation data set, both batched."""

    train: tf.data.Dataset = attrs.field(validator=attrs.validators.instance_of(tf.data.Dataset))
    validation: tf.data.Dataset | None = attrs.field(
        default=None,
        validator=attrs.validators.optional(attrs.validators.instance_of(tf.data.Dataset)),
    )


def as_data_split(data) -> DataSplit:
    """Accept a DataSplit, a Dataset, or a ``(train, validation)`` pair of Datasets."""
    if isinstance(data, DataSplit):
        split = data
    elif isinstance(data, tf.data.Dataset):
        split = DataSplit(data)
    elif isinstance(data, Sequence) and not isinstance(data, str) and len(data) == 2:
        train, validation = data
        for role, value in (("training", train), ("validation", validation)):
            if role == "validation" and value is None:
                continue
            if not isinstance(value, tf.data.Dataset):
                raise DataError(
                    f"data=(train, validation) expects tf.data.Dataset values; the {role} "
                    f"entry is {type(value).__name__}. Wrap arrays with "
                    "tf.data.Dataset.from_tensor_slices((x, y)).batch(32)"
                )
        split = DataSplit(train, validation)
    else:
        raise DataError(
            "data expects a tf.data.Dataset, a (train, validation) pair of them or a "
            f"beatloop.DataSplit; got {type(data).__name__}"
        )
    return DataSplit(
        as_dict_batches(split.train, "training"),
        None if split.validation is None else as_dict_batches(split.validation, "validation"),
    )


def as_evaluation_data(data) -> tf.data.Dataset:
    """An evaluation data set as dict batches: a batched ``tf.data.Dataset`` of ``(x, y)``
    tuples or dicts, like the validation data ``fit`` takes."""
    if not isinstance(data, tf.data.Dataset):
        raise DataError(
            "evaluation data must be a tf.data.Dataset of batched (x, y) tuples or dicts; "
            f"got {type(data).__name__}. Wrap arrays with "
            "tf.data.Dataset.from_tensor_slices((x, y)).batch(32)"
        )
    if data.cardinality() == tf.data.INFINITE_CARDINALITY:
        raise DataError(
            "the evaluation data set repeats forever (.repeat() without a count); give it an end"
        )
    return as_dict_batches(data, "evaluation")


def as_dict_batches(dataset: tf.data.Dataset, role: str) -> tf.data.Dataset:
    """Map tuple elements to dicts (``x``, ``y``, ``sample_weight``); refuse other shapes."""
    spec = dataset.element_spec
    if isinstance(spec, Mapping):
        _check_tensor_specs(spec, role)
        result = dataset
    elif isinstance(spec, tuple) and 1 <= len(spec) <= len(TUPLE_KEYS):
        keys = TUPLE_KEYS[: len(spec)]
        _check_tensor_specs(dict(zip(keys, spec, strict=True)), role)
        result = dataset.map(lambda *parts: dict(zip(keys, parts, strict=True)))
    elif isinstance(spec, tf.TensorSpec):
        _check_tensor_specs({"x": spec}, role)
        result = dataset.map(lambda x: {"x": x})
    else:
        raise DataError(
            f"the {role} data set's elements must be a dict of tensors or an (x, y) tuple; "
            f"found {spec}"
        )
    if result.cardinality() == 0:
        raise DataError(f"the {role} data set is empty: it gives no batches")
    if result is not dataset:
        _MAPPED[result] = dataset
    return result


def batched_source(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """The data set whose batches ``dataset``'s are, row for row: the user's, for one
    ``as_dict_batches`` mapped to dicts (``collectives.global_batch_size`` reads its
    batch size, which TensorFlow cannot read through the map); else ``dataset``."""
    return _MAPPED.get(dataset, dataset)


def _check_tensor_specs(spec: Mapping, role: str) -> None:
    for path, value in spec_paths(spec).items():
        if not isinstance(value, tf.TensorSpec):
            raise DataError(
                f"the {role} data set's {path!r} must be a tensor (a dense one: "
                f"{_kind(value)} is not taken), found {value}"
            )
        if value.shape.rank is None:
            raise DataError(_unknown_rank(path, role))
    for key, value in spec.items():
        if is_nested(value) and not spec_paths({key: value}):
            raise DataError(f"the {role} data set's {key!r} holds an empty {_kind(value)}")


def _kind(value) -> str:
    """What a spec is, in a word: ``RaggedTensorSpec``, ``dict``."""
    return type(value).__name__


def _unknown_rank(key: str, role: str) -> str:
    """Why a batch entry of unknown rank is refused (a ``tf.py_function``'s output has no
    shape), and how to give it one."""
    return (
        f"the {role} data set's {key!r} has an unknown shape (not even its number of "
        "dimensions: a tf.py_function or tf.numpy_function output has none); set it in the "
        "function that makes it, before .batch(): e.g. value.set_shape([64]) or value = "
        "tf.ensure_shape(value, [64]) for examples of 64 values (None for a size that varies)"
    )


def check_batch_spec(
    spec: Mapping[str, tf.TensorSpec],
    required: Mapping[str, int],
    owner: str,
    role: str,
) -> list[str]:
    """Problems with a batch spec: missing keys, too few dimensions (``required`` maps
    each key to its minimum rank, the batch dimension included)."""
    problems = []
    missing = [key for key in required if key not in spec]
    if missing:
        problems.append(
            f"{owner} expects {role} batches with keys {sorted(required)}; the data set gives "
            f"{sorted(spec)} (missing {missing})"
        )
    for key, min_rank in required.items():
        if key not in spec:
            continue
        # In a dict or tuple each tensor is a model input of its own: the batch dimension.
        least = 1 if is_nested(spec[key]) else min_rank
        for path, value in spec_paths({key: spec[key]}).items():
            if value.shape.rank is not None and value.shape.rank < least:
                problems.append(
                    f"{owner} expects {role} batch {path!r} with at least {least} "
                    f"dimension(s) (batch first), found shape {value.shape}; is the data set "
                    "batched? Call .batch(n) on it"
                )
    return problems


def nested_problems(spec: Mapping, nested: Iterable[str], owner: str, role: str) -> list[str]:
    """The keys holding a dict or tuple of tensors that the recipe takes as one tensor
    (it computes on them, not only hands them to a model): only ``nested`` may."""
    allowed = set(nested)
    problems = []
    for key, value in spec.items():
        if is_nested(value) and key not in allowed:
            paths = ", ".join(spec_paths({key: value}))
            takes = f" (it takes a structure in {sorted(allowed)} only)" if allowed else ""
            problems.append(
                f"{owner} takes {role} batch {key!r} as one tensor{takes}; the data set gives "
                f"a {_kind(value)} of tensors ({paths})"
            )
    return problems


def check_split(
    split: DataSplit,
    required: Mapping[str, int],
    recipe_check: Callable[[Mapping[str, tf.TensorSpec]], list[str]],
    owner: str,
    nested: Iterable[str] = (),
) -> None:
    """Raise one DataError naming every problem with a split's batches: keys and ranks
    (``required``), structures where the recipe takes one tensor (only ``nested`` keys
    may hold a dict or tuple of tensors), the recipe's own checks, and validation
    batches unlike training's."""
    problems = []
    for role, dataset in (("training", split.train), ("validation", split.validation)):
        if dataset is None:
            continue
        spec = dataset.element_spec
        problems += _problems(spec, required, recipe_check, owner, role, problems, nested)
    if split.validation is not None and not problems:
        problems += _validation_mismatches(split.train.element_spec, split.validation.element_spec)
    if problems:
        raise DataError("; ".join(problems))


def check_evaluation_data(
    dataset: tf.data.Dataset,
    training: Mapping[str, tf.TensorSpec],
    required: Mapping[str, int],
    recipe_check: Callable[[Mapping[str, tf.TensorSpec]], list[str]],
    owner: str,
    nested: Iterable[str] = (),
) -> None:
    """Raise one DataError naming every problem with the batches of an evaluation data
    set: the checks validation data gets (``training``: the training batches' spec)."""
    spec = dataset.element_spec
    problems = _problems(spec, required, recipe_check, owner, "evaluation", [], nested)
    if not problems:
        problems += _validation_mismatches(training, spec, "evaluation")
    if problems:
        raise DataError("; ".join(problems))


def _problems(
    spec, required, recipe_check, owner: str, role: str, earlier: list, nested=()
) -> list[str]:
    """A data set's problems: keys and ranks and structures, then (when nothing else is
    wrong so far) the recipe's own checks."""
    problems = nested_problems(spec, nested, owner, role)
    problems += check_batch_spec(spec, required, owner, role)
    if not earlier and not problems:
        problems += [f"{role} data: {p}" for p in recipe_check(spec)]
    return problems


def _validation_mismatches(
    train: Mapping, validation: Mapping, role: str = "validation"
) -> list[str]:
    problems = []
    for key in sorted(set(train) & set(validation)):
        trained, given = spec_paths({key: train[key]}), spec_paths({key: validation[key]})
        if set(trained) != set(given):
            problems.append(
                f"{role} batch {key!r} holds {sorted(given)} but training batch {key!r} "
                f"holds {sorted(trained)}"
            )
            continue
        for path in trained:
            t, v = trained[path], given[path]
            if t.dtype != v.dtype or not t.shape[1:].is_compatible_with(v.shape[1:]):
                problems.append(f"{role} batch {path!r} is {v} but training batch {path!r} is {t}")
    return problems


def batch_shapes(spec: Mapping) -> str:
    """``{x: (None, 64) float32, ...}``: the shapes and dtypes of a batch spec, each
    tensor of a dict or tuple by its path (``x/token_ids``)."""
    paths = spec_paths(spec)
    return "{" + ", ".join(f"{k}: {tuple(s.shape)} {s.dtype.name}" for k, s in paths.items()) + "}"


def leading_dimension(batch: Mapping[str, tf.Tensor]) -> tf.Tensor:
    """The number of examples in a batch: the first dimension of its first tensor."""
    return tf.shape(first_tensor(batch), out_type=tf.int64)[0]


def pipeline(dataset: tf.data.Dataset) -> Iterator[tf.data.Dataset]:
    """``dataset`` and every data set its pipeline is built on, each once, read through
    TensorFlow's private ``_inputs()``: a caller catches what a data set of a shape that
    API does not show raises."""
    pending, seen = [dataset], set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        pending.extend(current._inputs())
