"""The feature spec of a ``tfrecord`` source: which ``tf.train.Example`` features are read,
of what kind and fixed shape; its text form (``image=png,label=int64,x=float32:64``),
its inference from one record, the check of a record against it, and the batch parse.

A spec is a tuple of ``FeatureSpec`` values, one per feature, in name order. Kinds:
``int64`` (batch values int32), ``float32``, ``bytes`` (strings, kept only when named)
and ``image`` (PNG or JPEG bytes decoded to float32 pixels of shape height x width x
channels). A shape of ``()`` is one value per example (a scalar in the batch).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

KINDS = ("int64", "float32", "bytes", "image")
#: The text form's words for each kind (``label=int``, ``image=jpeg`` ...).
KIND_WORDS = {
    "int64": "int64",
    "int": "int64",
    "int32": "int64",
    "float32": "float32",
    "float": "float32",
    "float64": "float32",
    "bytes": "bytes",
    "string": "bytes",
    "image": "image",
    "png": "image",
    "jpeg": "image",
    "jpg": "image",
}
#: The proto field of each kind's values.
PROTO_LISTS = {"int64": "int64_list", "float32": "float_list", "bytes": "bytes_list"}
PROTO_LISTS["image"] = "bytes_list"
_IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff")


class SpecError(ValueError):
    """A feature spec's text that does not parse, or a record that does not match a spec
    (the message says which feature); the source turns it into a ``DataError``."""


@attrs.frozen
class FeatureSpec:
    """One feature: its ``name``, ``kind`` (one of ``KINDS``) and ``shape`` per example
    (``None`` for an image whose size the first record gives)."""

    name: str
    kind: str
    shape: tuple[int, ...] | None = ()

    def text(self) -> str:
        """The feature in the text form: ``x=float32:64``, ``image=image:8x8x1``."""
        shape = "" if not self.shape else ":" + "x".join(str(size) for size in self.shape)
        return f"{self.name}={self.kind}{shape}"


def spec_text(spec: Sequence[FeatureSpec]) -> str:
    """A whole spec in the text form ``--data-set features=`` takes."""
    return ",".join(feature.text() for feature in spec)


def parse_spec(items: Sequence[str]) -> tuple[FeatureSpec, ...]:
    """``["image=png", "x=float32:64", "grid=float32:8x8"]`` as a spec (``SpecError`` on
    a word it does not know)."""
    spec = []
    for item in items:
        name, sep, rest = item.partition("=")
        word, _, shape_text = rest.partition(":")
        kind = KIND_WORDS.get(word.strip().lower())
        if not sep or not name.strip() or kind is None:
            raise SpecError(
                f"features expects NAME=KIND[:SHAPE] items (KIND one of "
                f"{', '.join(sorted(KIND_WORDS))}; SHAPE like 64 or 8x8x1), got {item!r}"
            )
        shape = _shape(shape_text, item) if shape_text.strip() else None
        if kind != "image":
            shape = () if shape is None or shape == (1,) else shape
        elif shape is not None and len(shape) != 3:
            raise SpecError(f"an image's shape is HEIGHTxWIDTHxCHANNELS, got {item!r}")
        spec.append(FeatureSpec(name.strip(), kind, shape))
    names = [feature.name for feature in spec]
    if len(set(names)) != len(names):
        raise SpecError(f"features names a feature twice: {names}")
    return tuple(sorted(spec, key=lambda feature: feature.name))


def _shape(text: str, item: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(size) for size in text.lower().split("x"))
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        raise SpecError(f"a feature's shape is positive sizes joined by 'x', got {item!r}")
    return shape


def _example(record: bytes):
    import tensorflow as tf
    from google.protobuf.message import DecodeError

    try:
        return tf.train.Example.FromString(record)
    except DecodeError as error:
        raise SpecError(f"the record is not a serialized tf.train.Example ({error})") from None


def infer_spec(record: bytes) -> tuple[tuple[FeatureSpec, ...], list[str]]:
    """The spec of every feature of one serialized ``tf.train.Example`` (bytes that start
    like a PNG or JPEG are an image, decoded for its shape), and the names of the bytes
    features left out (not images: a model cannot take them)."""
    spec, skipped = [], []
    for name, feature in sorted(_example(record).features.feature.items()):
        kind = {"int64_list": "int64", "float_list": "float32", "bytes_list": "bytes"}.get(
            feature.WhichOneof("kind")
        )
        values = getattr(feature, PROTO_LISTS[kind]).value if kind else []
        if not values:
            raise SpecError(
                f"feature {name!r} holds no values in the first record, so its length "
                "cannot be told; name the features to read with --data-set features=..."
            )
        if kind == "bytes" and len(values) == 1 and values[0].startswith(_IMAGE_MAGIC):
            spec.append(FeatureSpec(name, "image", _image_shape(values[0], name)))
        elif kind == "bytes":
            skipped.append(name)
        else:
            spec.append(FeatureSpec(name, kind, () if len(values) == 1 else (len(values),)))
    return tuple(spec), skipped


def _image_shape(value: bytes, name: str) -> tuple[int, int, int]:
    import tensorflow as tf

    try:
        return tuple(tf.io.decode_image(value, expand_animations=False).shape.as_list())
    except (tf.errors.OpError, ValueError):
        raise SpecError(f"feature {name!r} starts like a PNG or JPEG but does not decode") from None


def with_image_shapes(spec: Sequence[FeatureSpec], record: bytes) -> tuple[FeatureSpec, ...]:
    """``spec`` with each image's missing shape taken from ``record``'s image."""
    example = _example(record)
    done = []
    for feature in spec:
        if feature.kind == "image" and feature.shape is None:
            values = _values(example, feature)
            feature = attrs.evolve(feature, shape=_image_shape(values[0], feature.name))
        done.append(feature)
    return tuple(done)


def _values(example, feature: FeatureSpec):
    """A feature's values in ``example``; ``SpecError`` when it is absent or of another
    kind."""
    found = example.features.feature
    if feature.name not in found:
        raise SpecError(f"it has no feature {feature.name!r} (it has {sorted(found)})")
    kind = found[feature.name].WhichOneof("kind")
    if kind != PROTO_LISTS[feature.kind]:
        raise SpecError(
            f"feature {feature.name!r} holds a {kind}, the spec {feature.text()!r} a "
            f"{PROTO_LISTS[feature.kind]}"
        )
    return getattr(found[feature.name], kind).value


def check_record(spec: Sequence[FeatureSpec], record: bytes) -> None:
    """``SpecError`` naming the first feature of ``spec`` that ``record`` does not match
    (absent, another kind, another length, an image of another shape)."""
    import math

    example = _example(record)
    for feature in spec:
        values = _values(example, feature)
        if feature.kind == "image":
            found = _image_shape(values[0], feature.name) if len(values) == 1 else None
            if found != feature.shape:
                raise SpecError(
                    f"feature {feature.name!r} is an image of shape {found}, the spec's "
                    f"{feature.shape}"
                )
        elif len(values) != math.prod(feature.shape):
            raise SpecError(
                f"feature {feature.name!r} holds {len(values)} value(s), the spec "
                f"{feature.text()!r} {math.prod(feature.shape)}"
            )


def parse_batch(spec: Sequence[FeatureSpec], keys: Mapping[str, str], scale: tuple[float, float]):
    """The function making a batch of serialized records into a dict batch: every
    feature of ``spec`` parsed at once (``tf.io.parse_example``), images decoded and
    scaled (``pixels * scale[0] + scale[1]``), int64 narrowed to int32, each feature under
    its batch key (``keys``: feature name -> batch key)."""
    import tensorflow as tf

    dtypes = {"int64": tf.int64, "float32": tf.float32, "bytes": tf.string, "image": tf.string}
    features = {
        f.name: tf.io.FixedLenFeature(() if f.kind == "image" else f.shape, dtypes[f.kind])
        for f in spec
    }
    images = {f.name: f.shape for f in spec if f.kind == "image"}
    multiply, add = scale

    def decode(values, shape):
        def one(value):
            image = tf.io.decode_image(value, channels=shape[2], expand_animations=False)
            return tf.ensure_shape(image, shape)

        signature = tf.TensorSpec(shape, tf.uint8)
        pixels = tf.map_fn(one, values, fn_output_signature=signature)
        return tf.cast(pixels, tf.float32) * multiply + add

    def parse(records):
        parsed = tf.io.parse_example(records, features)
        batch = {}
        for name, value in parsed.items():
            if name in images:
                value = decode(value, images[name])
            elif value.dtype == tf.int64:
                value = tf.cast(value, tf.int32)
            batch[keys.get(name, name)] = value
        return batch

    return parse
