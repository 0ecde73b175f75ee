"""A ``keep_best`` run for ``tests/test_keep_best_faults.py``, in its own process:
``python best_run.py SPEC_JSON``. It SIGKILLs itself at one moment of the save of the
new best at the end of epoch ``spec["epoch"]`` (a real crash: no ``finally``, no
cleanup), ``spec["kill"]`` saying which:

- ``"data"``: TensorFlow has written the checkpoint's tensors and moved its data file to
  its final name, but not yet written its index (``ckpt-N.index``). The merge of the
  shard into the checkpoint (``MergeV2Checkpoints``) renames the data file first and
  writes the index after; it is one C++ op, so this process renames the data file
  itself, as the op does, and is killed where the op would write the index.
- ``"whole"``: the checkpoint's files are whole, but the checkpoints' index
  (``checkpoints/checkpoint``) does not list it yet.
- ``"listed"``: the checkpoint is whole and listed, ``run.json`` still names the
  former best.
- ``"named"``: ``run.json`` names the new best, the former best is not deleted yet.

Without ``kill`` the run goes to its end (the tests fit their reference runs in their
own process with ``fit``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import beatloop
from beatloop.core.running.best import BestKeeper
from beatloop.core.saving.checkpoints import RunCheckpoints


def fit(spec: dict, callbacks=()):
    """The run ``spec`` describes, in this process."""
    return beatloop.fit(
        "supervised",
        config=spec["config"],
        epochs=spec["epochs"],
        seed=spec["seed"],
        steps_per_epoch=spec["steps_per_epoch"],
        steps_per_execution=1,
        run_dir=spec["run_dir"],
        keep_best=spec.get("keep_best"),
        max_to_keep=spec.get("max_to_keep", 1),
        checkpoint_every=spec.get("checkpoint_every"),
        callbacks=list(callbacks),
        progress=False,
    )


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def kill_in_the_merge(prefix: str, after: bool) -> None:
    """Die as the merge of checkpoint ``prefix``'s shard runs: before it writes the
    index (``after=False``) or once it returned (``after=True``)."""
    from tensorflow.python.ops import gen_io_ops

    merge = gen_io_ops.merge_v2_checkpoints

    def merged(checkpoint_prefixes, destination_prefix, *args, **kwargs):
        target = destination_prefix.numpy().decode()
        if Path(target).name != prefix:
            return merge(checkpoint_prefixes, destination_prefix, *args, **kwargs)
        if after:
            merge(checkpoint_prefixes, destination_prefix, *args, **kwargs)
            die()
        [shard] = [p.numpy().decode() for p in checkpoint_prefixes]
        data = ".data-00000-of-00001"
        os.rename(shard + data, target + data)  # what the op does first
        die()  # where it would write ckpt-N.index

    gen_io_ops.merge_v2_checkpoints = merged


def install_kill(kill: str, epoch: int) -> None:
    """Patch this process to die at ``kill`` in the save of epoch ``epoch``'s best (the
    checkpoint ``ckpt-{epoch + 1}``: ``ckpt-1`` is the start's)."""
    prefix = f"ckpt-{epoch + 1}"
    if kill in ("data", "whole"):
        kill_in_the_merge(prefix, after=kill == "whole")
    elif kill == "listed":
        write = BestKeeper.write

        def written(self, run_json):
            if self.best["epoch"] == epoch:
                die()
            write(self, run_json)

        BestKeeper.write = written
    elif kill == "named":
        protect = RunCheckpoints.protect

        def protected(self, name):
            if name == prefix:
                die()
            protect(self, name)

        RunCheckpoints.protect = protected
    else:
        raise ValueError(f"unknown kill {kill!r}")


def main(spec: dict) -> int:
    if spec.get("kill"):
        install_kill(spec["kill"], spec["epoch"])
    result = fit(spec)
    print(json.dumps({"steps": result.steps, "best": result.best}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
