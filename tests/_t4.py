import keras, tensorflow as tf, numpy as np
import beatloop
from helpers import all_weights
from phased_recipe import PretrainThenProbe, models, data, probe
from beatloop.core.step import TrainStep
from beatloop.core.metrics import StepMetrics
from beatloop.core.loop import CompiledLoop
sched = PretrainThenProbe().schedule().phases[1].schedule
train, _ = data()
batch = next(iter(train))
def run(kind):
    m = models(0)
    opts = {"pretrain": keras.optimizers.Adam(1e-2), "probe": keras.optimizers.Adam(1e-2)}
    bound = beatloop.bind(sched, m, opts, {"probe": probe, "reconstruction": probe}, train.element_spec)
    step = TrainStep(bound, StepMetrics(["probe"], {}, last=True), lambda *a: None)
    if kind == "step":
        tf.function(step, input_signature=[train.element_spec, tf.TensorSpec([], tf.int64)])(batch, tf.constant(0, tf.int64))
    elif kind == "loop":
        loop = CompiledLoop(step, 1, train.element_spec, checks=1)
        loop(iter(train.take(1)))
    else:
        v = list(m["probe"].trainable_variables)
        @tf.function(input_signature=[train.element_spec])
        def g(batch):
            with tf.GradientTape() as tape:
                loss = probe(m, batch)
            opts["probe"].apply(tape.gradient(loss, v), v)
        g(batch)
    return all_weights(m)
p = run("plain")
for kind in ("step", "loop"):
    a = run(kind)
    print(kind, {key: float(np.max(np.abs(a[key]-p[key]))) for key in a if key.startswith("probe")})
