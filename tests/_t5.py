import keras, tensorflow as tf, numpy as np
import beatloop
from helpers import all_weights
from phased_recipe import PretrainThenProbe, models, data, probe
from beatloop.core.engine import Engine, EngineOptions
from beatloop.core.batches import DataSplit
class ProbeOnly(PretrainThenProbe):
    name = "probe_only"
    def schedule(self):
        return super().schedule().phases[1].schedule
train, val = data()
batch = next(iter(train))
m = models(0)
v = list(m["probe"].trainable_variables)
opt = keras.optimizers.Adam(1e-2)
@tf.function(input_signature=[train.element_spec])
def g(batch):
    with tf.GradientTape() as tape:
        loss = probe(m, batch)
    opt.apply(tape.gradient(loss, v), v)
g(batch)
p = all_weights(m)
for split in (DataSplit(train.take(1)), DataSplit(train.take(1), val)):
    e = Engine(ProbeOnly(), split, options=EngineOptions(steps_per_execution=1))
    e.fit(1)
    a = all_weights(e.bound.models)
    print({key: float(np.max(np.abs(a[key]-p[key]))) for key in a if key.startswith("probe")})
