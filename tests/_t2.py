import keras, tensorflow as tf, numpy as np
from beatloop.core.forward import ModelCalls
from phased_recipe import models, data, probe
m = models(0)
train, _ = data()
batch = next(iter(train))
v = list(m["probe"].trainable_variables)
def make(calls):
    @tf.function(input_signature=[train.element_spec])
    def g(batch):
        with tf.GradientTape() as tape:
            loss = probe(calls(batch), batch)
        return tape.gradient(loss, v)
    return g
variants = {
  "plain": lambda b: m,
  "calls_train": lambda b: ModelCalls(m, frozenset({"probe"}), None, b, None),
  "calls_none": lambda b: ModelCalls(m, frozenset(), None, b, None),
}
res = {k: [x.numpy() for x in make(f)(batch)] for k, f in variants.items()}
for k in res: print(k, [float(np.max(np.abs(a-b))) for a, b in zip(res[k], res["plain"])])
