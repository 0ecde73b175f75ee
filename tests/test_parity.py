"""Parity with Keras ``fit``: same initial weights, data order, optimizer and batch size
give the same per-epoch loss and the same final weights, to float32 round-off."""

import keras
import numpy as np
import pytest
from helpers import assert_close_weights, classifier, model_weights, tuple_batches

import beatloop

# Both loops run the same float32 ops in the same order; on this machine the results are
# bit-identical. The tolerance allows a few ulps of drift on other CPUs/oneDNN builds.
RTOL, ATOL = 1e-6, 1e-7


def regularised_batchnorm_classifier(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(16, kernel_regularizer=keras.regularizers.L2(1e-3)),
            keras.layers.BatchNormalization(),
            keras.layers.Activation("relu"),
            keras.layers.Dense(10, kernel_regularizer=keras.regularizers.L2(1e-3)),
        ]
    )


@pytest.mark.parametrize(
    "build, batch_size",
    [(classifier, 32), (regularised_batchnorm_classifier, 48)],
    ids=["dense", "l2-batchnorm"],
)
def test_supervised_matches_keras_fit(small_digits, build, batch_size):
    train, validation = small_digits  # 200 examples: the last batch is short for both sizes
    reference = build()
    ours = keras.models.clone_model(reference)
    ours.set_weights(reference.get_weights())

    reference.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    keras_history = reference.fit(
        tuple_batches(train, batch_size),
        validation_data=tuple_batches(validation, batch_size),
        epochs=3,
        shuffle=False,
        verbose=0,
    ).history

    result = beatloop.fit(
        "supervised",
        data=(tuple_batches(train, batch_size), tuple_batches(validation, batch_size)),
        models={"model": ours},
        optimizers={"optimizer": keras.optimizers.Adam(1e-2)},
        epochs=3,
        seed=0,
    )
    for name in ("loss", "accuracy", "val_loss", "val_accuracy"):
        np.testing.assert_allclose(result.history[name], keras_history[name], rtol=RTOL, atol=ATOL)
    # The loss moved: the comparison is between two trainings, not two no-ops.
    assert result.history["loss"][-1] < 0.8 * result.history["loss"][0]
    assert_close_weights(model_weights(ours), model_weights(reference), rtol=RTOL, atol=ATOL)
