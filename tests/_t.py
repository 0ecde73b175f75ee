import keras, tensorflow as tf, numpy as np
import beatloop
from helpers import all_weights
from phased_recipe import PretrainThenProbe, models, data, reconstruction, probe
class ProbeOnly(PretrainThenProbe):
    name = "probe_only"
    def schedule(self):
        return super().schedule().phases[1].schedule
m = models(0)
train, _ = data()
batch = next(iter(train))
print({k: v.dtype for k, v in batch.items()})
v = list(m["probe"].trainable_variables)
opt = keras.optimizers.Adam(1e-2); opt.build(v)
@tf.function(input_signature=[train.element_spec])
def g(batch):
    with tf.GradientTape() as tape:
        loss = probe(m, batch)
    grads = tape.gradient(loss, v)
    opt.apply(grads, v)
    return loss, grads
loss, grads = g(batch)
ref = all_weights(m)
r = beatloop.fit(ProbeOnly, epochs=1, steps_per_epoch=1, seed=0, steps_per_execution=1, progress=False)
ours = all_weights(r.models)
print(r.history["probe"], float(loss))
print({key: float(np.max(np.abs(ours[key]-ref[key]))) for key in ref})
o = r.optimizers["probe"]
print([ (x.path, float(np.max(np.abs(x.numpy() - y.numpy())))) for x, y in zip(o.variables, opt.variables)])
print(o.learning_rate, opt.learning_rate, o.epsilon, opt.epsilon, type(o), o.iterations.numpy(), opt.iterations.numpy())
