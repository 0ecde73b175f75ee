"""``beatloop run ... --workers N``: N local workers of one MultiWorkerMirroredStrategy
run, started, watched and stopped by the launcher (``beatloop/cli/workers.py``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import ROOT, history_records, python_env

from beatloop.cli import build_parser, main
from beatloop.cli.workers import exit_code, tf_config, worker_command

#: A small supervised run: a few fixed-size calls an epoch (no timing of K, which
#: workers would do each on its own).
TINY = ["--set", "hidden=8", "--set", "batch_size=64", "--steps-per-execution", "4"]


def launcher(tmp_path, *argv: str) -> subprocess.Popen:
    """``beatloop run supervised ARGV`` in its own process, in ``tmp_path``."""
    command = [sys.executable, "-m", "beatloop", "run", "supervised", *argv]
    return subprocess.Popen(
        command,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=python_env(TF_CONFIG=None),
    )


def worker_pids(process: subprocess.Popen) -> list[int]:
    """The workers' pids from the launcher's first line (on stderr)."""
    first = process.stderr.readline()
    assert first.startswith("beatloop: 2 local workers on 127.0.0.1:"), first
    return [int(pid) for pid in first.split("(pids ")[1].split(")")[0].split(", ")]


def assert_gone(pids: list[int]) -> None:
    """No worker is left running (nor a zombie: the launcher waited for each)."""
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_each_worker_runs_the_same_command_as_one_worker_of_the_cluster(tmp_path):
    argv = ["run", "supervised", "--workers", "3", "--strategy", "none", "--epochs", "2"]
    command = worker_command(argv, tmp_path / "shared")
    assert command[:3] == [sys.executable, "-m", "beatloop"]
    args = build_parser().parse_args(command[3:])
    assert (args.workers, args.strategy, args.epochs) == (1, "multi_worker", 2)
    assert args.run_dir == tmp_path / "shared"
    assert build_parser().parse_args(worker_command(argv, None)[3:]).run_dir is None
    assert json.loads(tf_config(["127.0.0.1:1", "127.0.0.1:2"], 1)) == {
        "cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
        "task": {"type": "worker", "index": 1},
    }
    assert build_parser().parse_args(["run", "supervised"]).workers == 1  # a plain run
    assert [exit_code(code) for code in (0, 5, -9, -15)] == [0, 5, 137, 143]


@pytest.mark.parametrize(
    "argv, environment, fragment",
    [
        (["--strategy", "mirrored"], None, "--strategy mirrored is the devices of one process"),
        ([], '{"cluster": {}}', "TF_CONFIG is already set"),
    ],
)
def test_workers_refuse_another_cluster(argv, environment, fragment, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    if environment is not None:
        monkeypatch.setenv("TF_CONFIG", environment)
    run_dir = tmp_path / "run"
    assert main(["run", "supervised", "--workers", "2", *argv, "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("beatloop: error: --workers N ") and fragment in err, err
    assert not run_dir.exists()


def test_workers_count_and_run_files_are_checked(tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        main(["run", "supervised", "--workers", "0"])
    assert done.value.code == 2
    assert "--workers: expects an integer >= 1, got '0'" in capsys.readouterr().err
    run_file = tmp_path / "run.toml"
    run_file.write_text('recipe = "supervised"\nworkers = 2\n')
    assert main(["run", "--config", str(run_file), "--run-dir", str(tmp_path / "r")]) == 2
    assert "unknown key 'workers'" in capsys.readouterr().err  # the command line's alone


@pytest.mark.slow
def test_a_killed_worker_stops_the_others_and_says_how_to_resume(tmp_path):
    process = launcher(tmp_path, "--workers", "2", "--run-dir", "shared", *TINY)
    try:
        pids = worker_pids(process)
        os.kill(pids[1], signal.SIGKILL)
        start = time.monotonic()
        _, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 137, err  # the lost worker's, as a shell reports it
    assert time.monotonic() - start < 60
    assert_gone(pids)
    last = err.strip().splitlines()[-1]
    assert last.startswith("beatloop: error: worker 1 of 2 (127.0.0.1:"), err
    assert "was killed by SIGKILL; the other workers were stopped; run the same command " in last
    assert last.endswith("again to resume from the last checkpoint in shared")


@pytest.mark.slow
def test_sigterm_to_the_launcher_reaches_every_worker(tmp_path):
    process = launcher(tmp_path, "--workers", "2", "--run-dir", "shared", *TINY)
    try:
        pids = worker_pids(process)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 143, err
    assert_gone(pids)
    assert "beatloop: SIGTERM passed on to the 2 workers; run the same command again" in err


@pytest.mark.slow
def test_two_workers_train_one_run_dir_like_one_device(tmp_path):
    """Both workers write one run dir (the chief's), with steps per call ``auto``: the
    workers time their calls together (``workers.slowest_of``), so they settle on one K
    and their calls stay in step."""
    argv = ["--epochs", "2", "--seed", "0", "--quiet", *TINY[:4]]
    process = launcher(tmp_path, "--workers", "2", "--run-dir", "shared", *argv)
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err[-3000:]
    assert out.count("supervised: 2 epoch(s), 46 steps, seed 0;") == 1  # worker 0's output
    assert "run dir: shared" in out
    assert main(["run", "supervised", *argv, "--run-dir", str(tmp_path / "one")]) == 0
    workers, one = history_records(tmp_path / "shared"), history_records(tmp_path / "one")
    assert [r["epoch"] for r in workers] == [1, 2] and workers[1]["step"] == 46
    for mine, theirs in zip(workers, one, strict=True):
        assert mine["loss"] == pytest.approx(theirs["loss"], rel=1e-5)
        assert mine["val_loss"] == pytest.approx(theirs["val_loss"], rel=1e-5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one", "shared"]


def test_the_tfjob_manifest_parses_and_its_command_is_a_multi_worker_run():
    import yaml  # PyYAML: a test dependency (and mkdocs')

    text = (ROOT / "docs" / "tfjob.yaml").read_text()
    claim, job = yaml.safe_load_all(text)
    assert (claim["kind"], claim["spec"]["accessModes"]) == (
        "PersistentVolumeClaim",
        ["ReadWriteMany"],
    )
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "TFJob")
    worker = job["spec"]["tfReplicaSpecs"]["Worker"]
    assert (worker["replicas"], worker["restartPolicy"]) == (3, "OnFailure")
    pod = worker["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"][0] == "beatloop"
    args = build_parser().parse_args(container["command"][1:])
    assert (args.command, args.recipe, args.strategy, args.workers) == (
        "run",
        "supervised",
        "multi_worker",
        1,
    )
    assert str(args.run_dir).startswith("/runs/")
    (mount,) = container["volumeMounts"]
    (volume,) = pod["volumes"]
    assert mount == {"name": volume["name"], "mountPath": "/runs"}
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    # docs/distribution.md shows the same manifest (the file less its opening comment).
    shown = (ROOT / "docs" / "distribution.md").read_text().split("```yaml\n")[1].split("```")[0]
    assert shown == text[text.index("apiVersion") :]
