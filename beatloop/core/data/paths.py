"""A batch spec's tensors by *path*: a key holding one tensor is its own path, one
holding a dict or tuple of tensors (a model's named inputs, as Keras's ``fit`` takes
``x``) names each tensor in it ``x/token_ids`` (``x/0`` in a tuple). Checks, errors and
the run record name tensors by path; ``--data`` sources name batch keys by path
(``nest_paths``); a run record's spec is read back as a placeholder batch."""

from __future__ import annotations

import re
from collections.abc import Mapping

import tensorflow as tf

#: What joins a batch key and the keys (or positions) of the structure it holds: the
#: path of one tensor, ``x/token_ids``.
PATH_SEPARATOR = "/"


def spec_paths(spec: Mapping) -> dict[str, object]:
    """Each tensor of a batch spec by its path: a key holding one tensor is its own path;
    one holding a dict or tuple, ``key/name`` (``key/0``) for each tensor in it, nested
    as deep as it goes; dict entries in sorted order, as ``tf.nest`` flattens them."""
    paths: dict[str, object] = {}
    for key, value in spec.items():
        paths.update(_paths(str(key), value))
    return paths


def _paths(prefix: str, value) -> dict[str, object]:
    if isinstance(value, Mapping):
        items = [(str(k), value[k]) for k in sorted(value, key=str)]
    elif isinstance(value, tuple | list):
        items = [(str(i), v) for i, v in enumerate(value)]
    else:
        return {prefix: value}
    paths: dict[str, object] = {}
    for name, inner in items:
        paths.update(_paths(f"{prefix}{PATH_SEPARATOR}{name}", inner))
    return paths


def spec_record(spec: Mapping) -> dict[str, str]:
    """A batch spec as the run record keeps it: each tensor's ``TensorSpec`` as text, by
    path (a key of one tensor: by its name, as records always had it)."""
    return {path: str(value) for path, value in spec_paths(spec).items()}


def nest_paths(flat: Mapping[str, object]) -> dict[str, object]:
    """``{"x/a": t, "y": u}`` as ``{"x": {"a": t}, "y": u}``: values named by paths,
    nested (``spec_paths`` undone, tuples given back as dicts of their positions). A
    ``ValueError`` names a path that is not one, or puts a value inside another."""
    nested: dict[str, object] = {}
    for path, value in flat.items():
        parts = path.split(PATH_SEPARATOR)
        if any(not part for part in parts):
            raise ValueError(
                f"the batch key {path!r} is not a path of names joined by "
                f"{PATH_SEPARATOR!r} (e.g. x/token_ids)"
            )
        place = nested
        for part in parts[:-1]:
            inner = place.setdefault(part, {})
            if not isinstance(inner, dict):
                raise ValueError(
                    f"the batch key {path!r} puts a tensor inside {part!r}, which is a batch "
                    "key of its own; name one or the other"
                )
            place = inner
        if parts[-1] in place:
            raise ValueError(f"the batch key {path!r} is given twice (or holds other keys)")
        place[parts[-1]] = value
    return nested


#: A ``TensorSpec`` as the run record writes it (``str(spec)``).
_SPEC_TEXT = re.compile(r"TensorSpec\(shape=\((?P<shape>[^)]*)\), dtype=tf\.(?P<dtype>\w+)")


def placeholder_batches(recorded: Mapping[str, str]) -> tf.data.Dataset | None:
    """One batch of zeros of the batch spec a run record holds (each path's
    ``TensorSpec`` as text): enough to rebuild a run's models and trace its loops when
    its data is not at hand (``restore`` and ``export``), never to train or evaluate on.
    ``None`` when a spec's text cannot be read back."""
    zeros, rows = {}, set()
    for path, text in recorded.items():
        found = _SPEC_TEXT.match(text)
        if found is None:
            return None
        dims = [d.strip() for d in found["shape"].split(",") if d.strip()]
        if not dims:
            return None  # a scalar per batch is no batch
        shape = [1 if d == "None" else int(d) for d in dims]
        rows.add(None if dims[0] == "None" else shape[0])
        dtype = tf.as_dtype(found["dtype"])
        zeros[path] = tf.zeros(shape, dtype) if dtype != tf.string else tf.fill(shape, "")
    if len(rows) != 1:
        return None
    (fixed,) = rows
    batch = nest_paths(zeros)
    return tf.data.Dataset.from_tensor_slices(batch).batch(fixed or 1, drop_remainder=bool(fixed))


def is_nested(value) -> bool:
    """Whether a batch key's spec (or value) holds a dict or tuple of tensors."""
    return isinstance(value, Mapping | tuple | list)


def first_tensor(batch: Mapping):
    """A batch's first tensor by path (sorted): where its number of rows is read."""
    paths = spec_paths(batch)
    return paths[min(paths)]
