import keras, tensorflow as tf, numpy as np
import beatloop
from helpers import all_weights
from phased_recipe import PretrainThenProbe, models, data, probe
from beatloop.core.step import apply_update
sched = PretrainThenProbe().schedule().phases[1].schedule
train, _ = data()
batch = next(iter(train))
def run(kind):
    m = models(0)
    opts = {"pretrain": keras.optimizers.Adam(1e-2), "probe": keras.optimizers.Adam(1e-2)}
    bound = beatloop.bind(sched, m, opts, {"probe": probe, "reconstruction": probe})
    (group,) = bound.groups
    (beat,) = group.beats
    v = list(beat.variables)
    @tf.function(input_signature=[train.element_spec])
    def g(batch):
        if kind == "bound":
            _, _, (grads,) = group.gradients(m, batch)
        else:
            with tf.GradientTape() as tape:
                loss = probe(m, batch)
            grads = tape.gradient(loss, v)
        apply_update(beat, grads)
        return tf.constant(0)
    g(batch)
    return all_weights(m)
a, b = run("bound"), run("plain")
print({key: float(np.max(np.abs(a[key]-b[key]))) for key in a})
