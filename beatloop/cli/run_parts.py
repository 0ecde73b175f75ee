"""What ``run``'s flags turn into for ``fit``: the ``--model`` paths, the
``--strategy`` (with ``TF_CONFIG`` checked), and the callback announcing a resume."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path


def model_paths(values: Sequence[str]) -> dict[str, str]:
    """``--model NAME=PATH`` options as ``{NAME: PATH}`` (each name once)."""
    from beatloop.core.failures.errors import ConfigError

    paths: dict[str, str] = {}
    for value in values:
        name, equals, path = value.partition("=")
        name, path = name.strip(), path.strip()
        if not (equals and name.isidentifier() and path):
            raise ConfigError(
                f"--model expects NAME=PATH.keras (e.g. --model teacher=teacher.keras), "
                f"got {value!r}"
            )
        if name in paths:
            raise ConfigError(f"--model {name}=... is given twice")
        paths[name] = path
    return paths


def resume_notice():
    """A callback that says, before training, which checkpoint a run resumes from."""
    from beatloop.core.events.callbacks import Callback

    class ResumeNotice(Callback):
        def on_fit_start(self, run) -> None:
            if run.resumed_from:
                print(
                    f"resumed from {Path(run.resumed_from).name} ({run.counters.where()}): "
                    f"{run.resumed_from}",
                    flush=True,
                )

    return ResumeNotice()


def strategy(name: str):
    """The tf.distribute strategy named on the command line (``None`` for one device);
    ``multi_worker`` needs a cluster in ``TF_CONFIG``."""
    if name == "none":
        return None
    import tensorflow as tf

    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    check_tf_config(os.environ.get("TF_CONFIG"))
    return tf.distribute.MultiWorkerMirroredStrategy()


def check_tf_config(text: str | None) -> None:
    """Refuse ``--strategy multi_worker`` without a usable ``TF_CONFIG``: it would train
    one worker alone, silently."""
    import json

    from beatloop.core.failures.errors import ConfigError

    example = (
        'e.g. TF_CONFIG=\'{"cluster": {"worker": ["hostA:12345", "hostB:12345"]}, '
        '"task": {"type": "worker", "index": 0}}\''
    )
    if not text:
        raise ConfigError(
            "--strategy multi_worker needs the environment variable TF_CONFIG naming the "
            f"cluster's workers and this one's index ({example}); it is not set"
        )
    try:
        config = json.loads(text)
    except ValueError as error:
        raise ConfigError(f"TF_CONFIG is not valid JSON ({error}); {example}") from None
    workers = config.get("cluster", {}).get("worker") if isinstance(config, dict) else None
    task = config.get("task", {}) if isinstance(config, dict) else {}
    if not workers or "index" not in task:
        raise ConfigError(
            "TF_CONFIG must name the cluster's workers (cluster.worker) and this worker's "
            f"task.index; found {text!r}; {example}"
        )
    if task.get("type", "worker") not in ("chief", "worker"):
        raise ConfigError(
            f"TF_CONFIG's task.type is {task.get('type')!r}, but a multi-worker run trains "
            f"on the tasks 'chief' and 'worker' only; found {text!r}; {example}"
        )
