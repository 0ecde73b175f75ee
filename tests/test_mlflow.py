"""The MLflow logger (``--callback mlflow``): what a run logs, read back through MLflow's
own client from a real SQLite store under ``tmp_path``; a resumed run continuing its MLflow
run without a step twice; a study's trials nested in its run; a store out of reach
refused before training, one failing mid-run warned of once."""

from __future__ import annotations

import ast
import json
import math
import shutil
import socket
from pathlib import Path

import attrs
import numpy as np
import pytest
import tensorflow as tf
from helpers import all_weights, assert_same_weights, find_block, python_blocks
from mlflow.tracking import MlflowClient

import beatloop
from beatloop import images
from beatloop.callbacks import mlflow_store
from beatloop.callbacks.mlflow import MlflowLogger, TrackingWarning
from beatloop.cli import main
from beatloop.plugins import registry as registry_module
from beatloop.plugins.registry import Registry, registry
from beatloop.recipes.supervised import Supervised

SMALL = {"batch_size": 256}


@pytest.fixture(autouse=True)
def no_tracking_settings(monkeypatch):
    """The tests choose their stores: none of the user's MLflow settings leaks in."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory) -> Path:
    """An SQLite store with MLflow's tables and nothing in them, made once: MLflow makes
    a new one's tables in some 10 s (a hundred migrations, each synced to the disk)."""
    path = tmp_path_factory.mktemp("template") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


def store_near(folder: Path, empty_store: Path) -> str:
    """The default store of run dirs in ``folder`` (``folder/mlflow/mlflow.db``), made
    from the empty one; its URI."""
    (folder / "mlflow").mkdir(parents=True, exist_ok=True)
    shutil.copy(empty_store, folder / "mlflow" / "mlflow.db")
    return f"sqlite:///{folder.resolve() / 'mlflow' / 'mlflow.db'}"


def the_runs(uri: str, experiment: str = "supervised") -> list:
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    return [] if found is None else client.search_runs([found.experiment_id])


def metric_steps(client: MlflowClient, run_id: str) -> dict[str, list[tuple[int, float]]]:
    """Every metric's history as (step, value), by step."""
    keys = client.get_run(run_id).data.metrics
    return {
        key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        for key in keys
    }


def jsonl_steps(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """``history.jsonl``'s figures as (epoch, value), nulls (not finite) left out."""
    found: dict[str, list[tuple[int, float]]] = {}
    for line in (run_dir / "history.jsonl").read_text().splitlines():
        row = json.loads(line)
        for key, value in row.items():
            if key not in ("epoch", "step") and value is not None:
                found.setdefault(key, []).append((row["epoch"], value))
    return found


class OddFigureAndPicture(beatloop.Callback):
    """Adds a figure, NaN at the first epoch, and writes a picture each epoch, as a
    recipe's sample grid is written (before the writers see the epoch)."""

    def on_epoch_end(self, run, epoch, logs):
        logs["odd"] = math.nan if epoch == 0 else 0.5
        pixels = np.full((4, 4), 40 * epoch, dtype=np.uint8)
        images.save_png(pixels, Path(run.run_dir) / "grid" / f"epoch_{epoch + 1:03d}.png")
        run.artifacts["grid"] = images.save_png(pixels, Path(run.run_dir) / "grid.png")


def fit(run_dir: Path, *callbacks, epochs: int = 2, **options):
    return beatloop.fit("supervised", epochs=epochs, seed=3, config=SMALL, run_dir=run_dir,
                        progress=False, callbacks=list(callbacks), **options)  # fmt: skip


def test_a_run_logs_its_params_figures_by_epoch_schedule_and_files(tmp_path, empty_store):
    uri = store_near(tmp_path, empty_store)  # where run dirs in tmp_path log by default
    run_dir = tmp_path / "digits"
    logger = MlflowLogger(log_best=False)
    fit(run_dir, OddFigureAndPicture(), logger)
    (run,) = the_runs(uri)
    assert run.info.run_id == logger.run_id and run.info.status == "FINISHED"
    assert run.info.run_name == "digits" and run.data.tags["beatloop.run_dir"] == str(run_dir)
    recorded = json.loads((run_dir / "run.json").read_text())
    config = {f"config.{field}": str(value) for field, value in recorded["config"].items()}
    assert run.data.params == {
        "recipe": "supervised", "seed": "3", "precision": "float32",
        "steps_per_execution": "auto", **config, "version.python": recorded["versions"]["python"],
        "version.tensorflow": tf.__version__, "version.keras": recorded["versions"]["keras"],
        "version.beatloop": beatloop.__version__,
    }  # fmt: skip
    assert config["config.batch_size"] == "256" and len(config) == 9
    chosen = recorded["chosen_steps_per_execution"]  # None: "auto" had not chosen yet
    assert run.data.tags.get("beatloop.chosen_steps_per_execution") == (chosen and str(chosen))
    # Every figure at its epoch from 1, as history.jsonl numbers them; NaN is no point.
    client = MlflowClient(uri)
    logged = metric_steps(client, run.info.run_id)
    assert logged == jsonl_steps(run_dir)
    assert {"loss", "accuracy", "val_loss", "val_accuracy"} < set(logged)
    assert [step for step, _ in logged["loss"]] == [1, 2] and logged["odd"] == [(2, 0.5)]
    assert run.data.tags["beatloop.nonfinite.odd"] == "epoch 1: nan"
    files = {f.path for f in client.list_artifacts(run.info.run_id)}
    assert files == {"run.json", "schedule.txt", "grid.png", "grid"}
    inside = {f.path for f in client.list_artifacts(run.info.run_id, "grid")}
    assert inside == {"grid/epoch_001.png", "grid/epoch_002.png"}
    schedule = Path(client.download_artifacts(run.info.run_id, "schedule.txt", str(tmp_path)))
    assert schedule.read_text() == "\n".join(recorded["schedule"]) + "\n"
    assert recorded["schedule"][0] in run.data.tags["mlflow.note.content"]
    assert (tmp_path / "mlflow" / "artifacts" / run.info.run_id / "artifacts" / "run.json").exists()


def test_an_epoch_that_trained_no_step_has_no_training_metric_point(digits, tmp_path, empty_store):
    from test_untrained_epoch import fit_skipping

    uri = store_near(tmp_path, empty_store)
    with pytest.warns(RuntimeWarning, match="epoch 2 trained no step"):
        fit_skipping(digits, tmp_path / "skipped", epochs=3,
                     callbacks=[MlflowLogger(log_best=False)])  # fmt: skip
    (run,) = the_runs(uri)
    logged = metric_steps(MlflowClient(uri), run.info.run_id)
    assert logged == jsonl_steps(tmp_path / "skipped")
    assert [step for step, _ in logged["loss"]] == [1, 3]  # not a made-up 0.0 at 2
    assert [step for step, _ in logged["val_loss"]] == [1, 2, 3]


class FailAtEpochEnd(beatloop.Callback):
    """Fails after the writers logged epoch ``epoch`` (from 0) and before its checkpoint:
    as a run killed there, the resume trains that epoch again."""

    order = beatloop.Order.WRITER + 10

    def __init__(self, epoch: int):
        self.epoch = epoch

    def on_epoch_end(self, run, epoch, logs):
        if epoch == self.epoch:
            raise RuntimeError("killed after the epoch's figures were logged")


def test_a_resume_continues_the_mlflow_run_with_no_step_logged_twice(tmp_path, empty_store):
    uri = store_near(tmp_path, empty_store)
    run_dir = tmp_path / "digits"
    first = MlflowLogger(log_best=False)
    with pytest.raises(beatloop.UserCodeError, match="killed after"):
        fit(run_dir, first, FailAtEpochEnd(1), epochs=2)
    (failed,) = the_runs(uri)
    assert failed.info.status == "FAILED"
    client = MlflowClient(uri)
    assert [step for step, _ in metric_steps(client, first.run_id)["loss"]] == [1, 2]
    # Epoch 2 was logged, but its checkpoint never written: the command line's resume
    # trains it again, then epoch 3, in the same MLflow run.
    command = ["run", "supervised", "--run-dir", str(run_dir), "--epochs", "3", "--quiet"]
    assert main([*command, "--set", "batch_size=256", "--callback", "mlflow"]) == 0
    (resumed,) = the_runs(uri)
    assert resumed.info.run_id == first.run_id and resumed.info.status == "FINISHED"
    logged = metric_steps(client, first.run_id)
    assert [step for step, _ in logged["loss"]] == [1, 2, 3]
    assert logged == jsonl_steps(run_dir)  # the epoch trained twice gave the same figures
    # A finished run continued with more epochs goes on in it too.
    fit(run_dir, MlflowLogger(log_best=False), epochs=4)
    assert [run.info.run_id for run in the_runs(uri)] == [first.run_id]
    assert [step for step, _ in metric_steps(client, first.run_id)["loss"]] == [1, 2, 3, 4]


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_tracking_server_out_of_reach_is_a_config_error_before_the_first_step(tmp_path):
    uri = f"http://127.0.0.1:{closed_port()}"
    run_dir = tmp_path / "digits"
    with pytest.raises(beatloop.ConfigError, match="cannot be reached") as caught:
        fit(run_dir, MlflowLogger(tracking_uri=uri))
    assert uri in str(caught.value) and "the run did not start" in str(caught.value)
    assert isinstance(caught.value.__cause__, ConnectionRefusedError)
    assert not run_dir.exists()  # put back as it was: nothing trained, nothing to resume


def test_a_run_dir_trained_without_the_logger_logs_its_earlier_epochs_when_it_is_added(
    tmp_path, empty_store
):
    uri = store_near(tmp_path, empty_store)
    run_dir = tmp_path / "digits"
    fit(run_dir, epochs=1)
    logger = MlflowLogger(log_best=False)
    fit(run_dir, logger, epochs=2)
    logged = metric_steps(MlflowClient(uri), logger.run_id)
    assert [step for step, _ in logged["loss"]] == [1, 2]
    assert logged == jsonl_steps(run_dir)


class DeleteTheRun(beatloop.Callback):
    """Deletes the logger's MLflow run in the store after its first epoch: the store
    refuses every later write, as one whose server went away does."""

    def __init__(self, logger: MlflowLogger, uri: str):
        self.logger, self.uri = logger, uri

    def on_epoch_end(self, run, epoch, logs):
        if epoch == 1:
            MlflowClient(self.uri).delete_run(self.logger.run_id)


def test_a_store_failing_mid_run_is_one_warning_and_the_run_goes_on(
    tmp_path, empty_store, monkeypatch
):
    uri = store_near(tmp_path / "elsewhere", empty_store)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # the user's store and experiment
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "digits study")
    logger = MlflowLogger(log_best=False)
    with pytest.warns(TrackingWarning) as caught:
        result = fit(tmp_path / "digits", DeleteTheRun(logger, uri), logger, epochs=3)
    assert result.epochs == 3 and len(caught) == 1
    assert "the run goes on untracked" in str(caught[0].message)
    assert the_runs(uri, "digits study") == []  # deleted
    logged = MlflowClient(uri).get_metric_history(logger.run_id, "loss")
    assert [m.step for m in logged] == [1]
    assert not (tmp_path / "mlflow").exists()  # the default store was not used


def test_a_studys_trials_are_runs_nested_in_the_studys_run(tmp_path, empty_store):
    from beatloop.tuning import _study_run
    from beatloop.tuning.spec import Objective, StudySpec, spec_from_json, spec_to_json
    from beatloop.tuning.study import load_study
    from beatloop.tuning.trial import run_trial

    space = ("learning_rate=log:1e-3:1e-1",)
    spec = StudySpec("supervised", space, Objective("val_loss", "min"), tmp_path / "study",
                     fixed=("batch_size=256",), trials=2, epochs=1,
                     callbacks=("mlflow",))  # fmt: skip
    uri = store_near(spec.out, empty_store)
    spec = attrs.evolve(spec, mlflow_parent=_study_run(spec))
    assert _study_run(spec) == spec.mlflow_parent  # a continued study: the same run
    assert spec_from_json(json.loads(json.dumps(spec_to_json(spec)))) == spec  # to a trial
    study = load_study(spec, create=True)
    import optuna

    rates = optuna.distributions.FloatDistribution(1e-3, 1e-1, log=True)
    for _ in range(2):  # each trial as its process runs it, here in this one
        assert run_trial(spec, study.ask({"learning_rate": rates}).number) == 0
    mlflow_store.end_study_run(spec.mlflow_parent, spec.out)
    runs = {run.info.run_name: run for run in the_runs(uri)}
    assert sorted(runs) == ["study supervised", "trial-0000", "trial-0001"]
    parent = runs.pop("study supervised")
    assert parent.info.run_id == spec.mlflow_parent and parent.info.status == "FINISHED"
    assert parent.data.params["space"] == space[0] and parent.data.params["trials"] == "2"
    tried = {str(t.number): t.params["learning_rate"] for t in load_study(spec).trials}
    for name, run in runs.items():
        assert run.data.tags["mlflow.parentRunId"] == spec.mlflow_parent
        assert name == f"trial-{int(run.data.params['trial']):04d}"
        assert float(run.data.params["config.learning_rate"]) == tried[run.data.params["trial"]]


def test_tune_takes_callbacks_by_name_and_refuses_an_unknown_one_before_any_trial(tmp_path, capsys):
    out = tmp_path / "study"
    command = ["tune", "supervised", "--space", "hidden=int:4:16", "--out", str(out)]
    assert main([*command, "--callback", "mlflw"]) == 2
    assert "no callback named 'mlflw' (did you mean 'mlflow'?)" in capsys.readouterr().err
    assert not out.exists()
    (tmp_path / "tune.toml").write_text('recipe = "supervised"\ncallbacks = "mlflow"\n')
    assert main(["tune", "--config", str(tmp_path / "tune.toml"), "--out", str(out)]) == 2
    assert "'callbacks' expects a list of callback names" in capsys.readouterr().err


def test_the_best_epochs_models_are_logged_as_export_writes_them(tmp_path, empty_store):
    uri = store_near(tmp_path, empty_store)
    logger = MlflowLogger()
    fit(tmp_path / "digits", logger, keep_best="val_loss")
    client = MlflowClient(uri)
    best = json.loads((tmp_path / "digits" / "run.json").read_text())["best"]
    tag = client.get_run(logger.run_id).data.tags["beatloop.best"]
    assert tag == f"val_loss:min epoch {best['epoch']} = {best['value']:.6g}"
    (model,) = client.list_artifacts(logger.run_id, "best")
    inside = {f.path for f in client.list_artifacts(logger.run_id, model.path)}
    assert f"{model.path}/saved_model.pb" in inside


def test_the_best_epoch_of_a_recipe_registered_in_a_script_is_exported_by_the_run(
    tmp_path, empty_store, monkeypatch
):
    """The process that trained writes the best epoch's SavedModel: a recipe registered
    only there (no other process could rebuild the run) is exported, not logged as a raw
    checkpoint; the model is the best epoch's, and the run ends with its own weights."""

    class Scripted(Supervised):
        """Registered in this process alone."""

        name = "scripted_for_mlflow"

    monkeypatch.setattr(Scripted, "__module__", "__main__")
    monkeypatch.setattr(registry_module, "_REGISTRY", Registry(load_entry_points=False))
    beatloop.register(Scripted)
    uri = store_near(tmp_path, empty_store)
    logger, run_dir = MlflowLogger(experiment="scripted"), tmp_path / "scripted"
    result = beatloop.fit("scripted_for_mlflow", epochs=3, seed=3, config=SMALL, run_dir=run_dir,
                          progress=False, callbacks=[logger], keep_best="val_loss:max")  # fmt: skip
    best = json.loads((run_dir / "run.json").read_text())["best"]
    assert best["epoch"] < 3  # the worst validation loss: not the last epoch's weights
    client = MlflowClient(uri)
    tags = client.get_run(logger.run_id).data.tags
    assert "beatloop.best_export" not in tags
    assert client.list_artifacts(logger.run_id, "best_checkpoint") == []
    served = tf.saved_model.load(
        client.download_artifacts(logger.run_id, "best/model", str(tmp_path))
    )
    x = tf.random.stateless_normal((5, 64), seed=(1, 2))
    at_best = beatloop.restore(run_dir, best=True).models["model"](x, training=False)
    np.testing.assert_allclose(served.serve(x), at_best, rtol=1e-6, atol=1e-6)
    latest = beatloop.restore(run_dir).models
    assert_same_weights(all_weights(result.models), all_weights(latest))


def test_the_tracking_page_block_runs(tmp_path, empty_store, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = store_near(tmp_path / "runs", empty_store)
    monkeypatch.setattr(registry_module, "_REGISTRY", Registry(load_entry_points=False))
    find_block('run_dir="runs/digits",').run({})
    (run,) = the_runs(uri)
    assert run.info.run_name == "digits" and run.info.status == "FINISHED"


def test_the_fine_tuning_page_runs_and_its_run_dir_serves_the_shell(
    tmp_path, empty_store, monkeypatch, capsys
):
    """docs/finetuning.md: its blocks in order (a model of named inputs fine-tuned with
    accumulation, an evaluated average, the best epoch kept and MLflow), then its shell
    lines, which rebuild the run from its run dir alone."""
    monkeypatch.chdir(tmp_path)
    uri = store_near(tmp_path / "runs", empty_store)
    page = Path(__file__).resolve().parents[1] / "docs" / "finetuning.md"
    namespace: dict = {}
    blocks = [block for block in python_blocks([page]) if block.not_run is None]
    assert len(blocks) == 3
    for block in blocks:
        monkeypatch.setattr(registry_module, "_REGISTRY", Registry(load_entry_points=False))
        block.run(namespace)
    result, best = namespace["result"], namespace["best"]
    (run,) = the_runs(uri)
    assert run.info.status == "FINISHED" and run.data.params["config.accumulate"] == "4"
    assert result.history["loss"][-1] < result.history["loss"][0]  # it learnt
    capsys.readouterr()
    text = page.read_text()
    shell = text[text.index("```sh\n", text.index("## Afterwards")) + 6 :].split("```")[0]
    lines = [line.split("#")[0].split() for line in shell.strip().splitlines()]
    assert [line[:2] for line in lines] == [["beatloop", "evaluate"], ["beatloop", "export"]]
    for line in lines:
        assert main(line[1:]) == 0
    printed = dict(line.split() for line in capsys.readouterr().out.splitlines()[:4])
    figures = beatloop.evaluate("runs/finetune", namespace["validation"], best=True)
    assert float(printed["loss"]) == pytest.approx(figures["loss"], rel=1e-3)
    inputs = {k: tf.constant(v) for k, v in namespace["sentences"](8, seed=3)[0].items()}
    exported = tf.saved_model.load("out/best/model")
    np.testing.assert_allclose(exported.serve(inputs), best["ema"](inputs), rtol=1e-5, atol=1e-6)


def test_mlflow_is_named_mlflow_and_imported_only_when_a_run_starts():
    assert registry().callback("mlflow").cls is MlflowLogger is beatloop.MlflowLogger
    for module in ("mlflow.py", "mlflow_store.py"):
        tree = ast.parse((Path(beatloop.__file__).parent / "callbacks" / module).read_text())
        imported = [alias.name for node in tree.body if isinstance(node, ast.Import)
                    for alias in node.names]  # fmt: skip
        imported += [node.module for node in tree.body if isinstance(node, ast.ImportFrom)]
        assert not [name for name in imported if name.split(".")[0] == "mlflow"], module
    assert mlflow_store.tracking_uri(None, Path("/data/runs/a")) == (
        "sqlite:////data/runs/mlflow/mlflow.db"
    )
