"""Start-up and memory: a first, short fit of each built-in recipe in beatloop beside
Keras ``fit`` of the same models on the same data, each in a fresh process.

Every run is a new Python process, so importing TensorFlow and tracing are cold; the
import is timed apart. Per run: seconds from calling ``fit`` to the end of its first
step (tracing included), the whole fit (``--epochs`` epochs of the recipe's built-in
data, its validation included), and the process's peak resident memory
(``ru_maxrss``). The recipes' end-of-epoch figures and callbacks (sample grids,
pictures) are left out of both sides: only the steps and validation are compared.

Keras's side: ``supervised`` is ``model.compile`` + ``fit`` with the recipe's model,
optimizer, loss and accuracy; every other recipe is a Keras model whose custom
``train_step``/``test_step`` runs the recipe's beats (its own loss functions, bound by
beatloop's binding without its probe: gradients, transform, optimizer, constraint, the
recipe's metrics), so both sides trace the same step and differ in the loop around it.
Runs are interleaved, each pair repeated ``--repeats`` times; medians and spread.

    python benchmarks/startup.py                 # every recipe, 3 repeats (minutes)
    python benchmarks/startup.py --quick         # supervised and gan, 1 repeat
    python benchmarks/startup.py --recipes wgan_gp --epochs 1   # the example plugin's WGAN-GP
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse
import json
import resource
import statistics
import sys
import time

RECIPES = ("supervised", "gan", "style_transfer", "risk_weighted", "multitask")
LOOPS = ("beatloop", "keras")


# --- in the child process ---------------------------------------------------------------


def child(loop: str, recipe_name: str, epochs: int) -> dict:
    start = time.perf_counter()
    import keras
    import tensorflow as tf

    import beatloop

    imported = time.perf_counter() - start
    recipe = make_recipe(recipe_name, beatloop)
    recipe.epoch_figures = lambda run: {}
    recipe.callbacks = lambda: []
    data = recipe.default_data(0)
    keras.utils.set_random_seed(0)
    models = recipe.build_models(data.train.element_spec)
    optimizers = recipe.build_optimizers()
    first: list[float] = []
    if loop == "beatloop":

        class FirstStep(beatloop.Callback):
            def on_execution_end(self, run, steps, logs):
                if not first:
                    first.append(time.perf_counter())

        from common import as_the_others  # op determinism off, as in Keras's process

        began = time.perf_counter()
        beatloop.fit(
            recipe, data=data, epochs=epochs, seed=0, progress=False,
            models=models, optimizers=optimizers, callbacks=[FirstStep()], **as_the_others(),
        )  # fmt: skip
    else:

        class FirstBatch(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if not first:
                    first.append(time.perf_counter())

        model, train, validation = keras_side(recipe, data, models, optimizers, tf, keras)
        began = time.perf_counter()
        model.fit(
            train,
            validation_data=validation,
            epochs=epochs,
            verbose=0,
            shuffle=False,
            callbacks=[FirstBatch()],
        )
    ended = time.perf_counter()
    return {
        "import_s": imported,
        "first_step_s": first[0] - began,
        "fit_s": ended - began,
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def make_recipe(name: str, beatloop):
    """A built-in recipe by name, or ``wgan_gp``: the example plugin's, without installing it."""
    if name != "wgan_gp":
        return beatloop.make_recipe(name, {})
    examples = os.path.join(os.path.dirname(__file__), "..", "examples", "beatloop-example-plugin")
    sys.path.insert(0, os.path.abspath(examples))
    from beatloop_example_plugin.wgan_gp import WganGp

    return WganGp()


def keras_side(recipe, data, models, optimizers, tf, keras):
    """The Keras model and the data its ``fit`` takes for ``recipe``."""
    if recipe.name == "supervised":
        (model,) = models.values()
        (optimizer,) = optimizers.values()
        model.compile(
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
        as_pair = lambda batch: (batch["x"], batch["y"])  # noqa: E731
        validation = data.validation and data.validation.map(as_pair)
        return model, data.train.map(as_pair), validation
    return (
        ScheduleModel.of(recipe, data, models, optimizers, tf, keras),
        data.train,
        data.validation,
    )


class ScheduleModel:
    """A Keras model running a recipe's beats in ``train_step`` (made on first use, so
    that importing this script does not import Keras)."""

    @staticmethod
    def of(recipe, data, models, optimizers, tf, keras):
        from beatloop import bind

        random = tf.random.Generator.from_seed(0)
        bound = bind(
            recipe.schedule(), models, optimizers, recipe.losses(), random=random,
            forwards=recipe.forwards(), supplied=frozenset(recipe.supplied_models),
        )  # fmt: skip

        class Model(keras.Model):
            def __init__(self):
                super().__init__()
                self.parts = list(models.values())
                self.train_metrics = recipe.build_metrics()
                self.test_metrics = recipe.build_metrics()
                self.loss_means = {b.name: keras.metrics.Mean(b.name) for b in bound.beats}
                self.val_means = {b.name: keras.metrics.Mean(b.name) for b in bound.beats}
                self.built = True

            def train_step(self, batch):
                outputs = {}
                for group in bound.groups:
                    for _ in range(group.repeat):
                        losses, outputs_now, grads = group.gradients(models, batch, random=random)
                        outputs.update(outputs_now)
                        for beat, loss, beat_grads in zip(group.beats, losses, grads, strict=True):
                            variables = list(beat.variables)
                            if beat.transform is not None:
                                beat_grads = beat.transform(beat_grads)
                            beat.optimizer.apply(beat_grads, variables)
                            if beat.constraint is not None:
                                for variable in variables:
                                    variable.assign(beat.constraint(variable))
                            self.loss_means[beat.name].update_state(loss)
                recipe.update_metrics(self.train_metrics, batch, outputs)
                return self.figures(self.train_metrics, self.loss_means)

            def test_step(self, batch):
                outputs = {}
                for group in bound.groups:
                    losses, outputs_now = group.losses(models, batch, training=False, random=random)
                    outputs.update(outputs_now)
                    for beat, loss in zip(group.beats, losses, strict=True):
                        self.val_means[beat.name].update_state(loss)
                recipe.update_metrics(self.test_metrics, batch, outputs)
                return self.figures(self.test_metrics, self.val_means)

            def figures(self, metrics, loss_means):
                means = {name: m.result() for name, m in loss_means.items()}
                return {**means, **{name: m.result() for name, m in metrics.items()}}

        model = Model()
        model.compile()
        return model


# --- in the parent process --------------------------------------------------------------


def run_child(loop: str, recipe: str, epochs: int) -> dict:
    """One fresh child's figures (its import of TensorFlow among them)."""
    from common import fresh_process

    arguments = ["--child", loop, recipe, "--epochs", str(epochs)]
    return fresh_process(__file__, arguments, f"{loop} {recipe}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, metavar=("LOOP", "RECIPE"))
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child, args.epochs)))
        return 0
    from common import interleaved, spread  # the parent's alone: a child times its own imports

    recipes = ("supervised", "gan") if args.quick else tuple(args.recipes.split(","))
    repeats = 1 if args.quick else args.repeats

    def run(recipe: str, loop: str) -> dict:
        return run_child(loop, recipe, args.epochs)

    runs = interleaved(recipes, LOOPS, repeats, run)
    print(f"first fit, {args.epochs} epochs, fresh process each; medians of {repeats} (spread)")
    header = f"{'recipe':15} {'figure':14} {'beatloop':>16} {'Keras fit':>16} {'ratio':>7}"
    print(header)
    print("-" * len(header))
    for recipe in recipes:
        for key, unit in (
            ("import_s", "s"), ("first_step_s", "s"), ("fit_s", "s"), ("rss_mb", "MB"),
        ):  # fmt: skip
            ours = [run[key] for run in runs[recipe, "beatloop"]]
            theirs = [run[key] for run in runs[recipe, "keras"]]
            a, b = statistics.median(ours), statistics.median(theirs)
            extra = f"{a - b:+7.0f}" if unit == "MB" else f"{a / b:6.2f}x"
            print(
                f"{recipe:15} {key:14} {a:9.2f}{unit:2} {spread(ours):>4} "
                f"{b:9.2f}{unit:2} {spread(theirs):>4} {extra:>7}"
            )
    print("ratio: beatloop / Keras fit (below 1: beatloop first); MB: beatloop minus Keras fit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
