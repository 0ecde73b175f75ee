"""``beatloop compare``: recipes (or configs of one recipe) side by side on a fixed
budget: one table of speed, memory, final losses and quality, a PNG of the loss curves
and a JSON file of every figure.

Each run goes in its own process (``python -m beatloop.compare SPEC``), so its timing is
not disturbed by the runs before it and its peak memory is its own. With several seeds
each figure is a mean over the seeds with a 95% bootstrap interval, and the table says
whether the best quality is ahead of the others by more than the seeds' spread.

A run that fails ends its entry (the entry's other runs are not started, or stopped),
not the comparison: the other entries run on, the table and ``compare.json`` hold the
entries whose every run finished, and ``ComparisonFailed`` then names each failed run
in beatloop's words with the exit code its failure has on the command line.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from beatloop.compare_report import bootstrap_interval, plot_loss_curves, quality_lead
from beatloop.core.failures.errors import BeatloopError
from beatloop.forking import ForkedChild, popen

#: A row's figures that get a mean and an interval over the seeds (``final_losses`` too,
#: per beat, and ``quality_value``).
FIGURES = ("steps_per_second", "examples_per_second", "peak_memory_mb", "memory_growth_mb")


@attrs.frozen
class Entry:
    """One run to compare: a recipe name, its config overrides (``--set`` texts) and,
    optionally, a study directory whose best trial's config (``best.toml``, written by
    ``beatloop tune``) comes before those overrides."""

    recipe: str
    settings: tuple[str, ...] = ()
    tuned: str | None = None

    @property
    def label(self) -> str:
        tuned = [] if self.tuned is None else [f"tuned({Path(self.tuned).name})"]
        return " ".join([self.recipe, *tuned, *self.settings])

    @property
    def slug(self) -> str:
        text = "-".join(self.label.split(" "))
        return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


@attrs.frozen
class RunFailure:
    """One run of a comparison that failed: its entry's ``label``, ``seed`` and
    ``run_dir``; ``message``, what ended it in beatloop's words (no class path);
    ``exit_code``, what ``beatloop run`` would have exited with (``EXIT_CODES``: a
    ``NumericsError`` is 4). ``own_words``: the message is the recipe's own (a
    ``UserCodeError``), to be shown as written; ``internal``: not an error beatloop
    raised on purpose (a bug, or the process killed), ``detail`` then holds what the
    process wrote on standard error (its traceback)."""

    label: str
    seed: int
    run_dir: str
    message: str
    exit_code: int
    own_words: bool = False
    internal: bool = False
    detail: str = ""

    def text(self, words: Callable[[str], str] = str) -> str:
        """The failure on one line, ``words`` putting beatloop's message in the caller's
        spelling (the command line's advice)."""
        message = self.message if self.own_words else words(self.message)
        return f"{self.label} (seed {self.seed}, run dir {self.run_dir}) failed: {message}"


class ComparisonFailed(BeatloopError):
    """Runs of a comparison failed. ``rows`` are the entries whose every run finished
    (written to ``compare.json`` and drawn, as a comparison without failures is);
    ``failures`` each failed run, in the entries' order. The exit code is the first
    failure's in that order: the same entries fail with the same code at any
    ``--jobs``, and it is the failure printed first."""

    def __init__(self, rows: list[dict[str, Any]], failures: Sequence[RunFailure]):
        self.rows, self.failures = rows, tuple(failures)
        finished = f"; the table holds the {len(rows)} entr{'y' if len(rows) == 1 else 'ies'}"
        super().__init__(
            "; ".join(failure.text() for failure in self.failures)
            + (f"{finished} whose runs finished" if rows else "; no entry finished")
        )

    @property
    def exit_code(self) -> int:
        return self.failures[0].exit_code


def parse_entries(tokens: Sequence[str]) -> list[Entry]:
    """``gan --set n_critic=1 gan --set n_critic=5 supervised`` -> three entries: each
    ``--set`` (and ``--tuned STUDY_DIR``) applies to the recipe named before it."""
    entries: list[tuple[str, list[str], list[str]]] = []
    tokens = list(tokens)
    while tokens:
        token = tokens.pop(0)
        option = token.partition("=")[0]
        if option in ("--set", "--tuned"):
            value = (
                token.partition("=")[2] if token != option else (tokens.pop(0) if tokens else "")
            )
            if not entries:
                raise ValueError(f"{option} {value} comes before any recipe name")
            if option == "--set":
                if not value:
                    raise ValueError("--set needs FIELD=VALUE")
                entries[-1][1].append(value)
                continue
            if not value:
                raise ValueError("--tuned needs STUDY_DIR (a `beatloop tune` study)")
            if entries[-1][2]:
                raise ValueError(
                    f"--tuned given twice for {entries[-1][0]} ({entries[-1][2][0]}, {value}): "
                    "name the recipe again for a second tuned entry"
                )
            entries[-1][2].append(value)
        elif token.startswith("-"):
            raise ValueError(f"unknown option {token!r} among the recipes to compare")
        else:
            entries.append((token, [], []))
    if not entries:
        raise ValueError("name at least one recipe to compare")
    return [Entry(name, tuple(sets), tuned[0] if tuned else None) for name, sets, tuned in entries]


def tuned_settings(entry: Entry) -> tuple[str, ...]:
    """The ``--set`` texts of ``entry``'s study's best trial (its ``best.toml``), none
    without ``--tuned``; a ``ConfigError`` for a study that is missing, unfinished, of
    another recipe, or not TOML."""
    import tomllib

    from beatloop.core.failures.errors import ConfigError
    from beatloop.run_file import setting_text

    if entry.tuned is None:
        return ()
    study = Path(entry.tuned)
    best = study / "best.toml"
    if not study.is_dir():
        raise ConfigError(f"--tuned {study}: no such study directory; run `beatloop tune` first")
    if not best.is_file():
        raise ConfigError(
            f"--tuned {study}: it has no best.toml (the study's best trial); run `beatloop tune` "
            "first, or let it finish"
        )
    try:
        values = tomllib.loads(best.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"--tuned {best} is not valid TOML: {error}") from None
    recipe, config = values.get("recipe"), values.get("config", {})
    if recipe != entry.recipe:
        raise ConfigError(
            f"--tuned {best} is a tuned config of recipe {recipe!r}, not {entry.recipe!r}: give "
            f"it after {recipe!r}, or tune {entry.recipe!r}"
        )
    if not isinstance(config, dict):
        raise ConfigError(f"--tuned {best}: [config] expects a table of config fields")
    return tuple(f"{name}={setting_text(value)}" for name, value in config.items())


def compare(
    entries: Sequence[Entry],
    *,
    epochs: int,
    out: Path,
    seed: int = 0,
    seeds: int = 1,
    repeats: int = 1,
    jobs: int = 1,
    steps_per_execution: int | str = "auto",
    data: str | None = None,
    data_settings: Sequence[str] = (),
    validation_data: str | None = None,
    imports: Sequence[str] = (),
    timeout: float = 1800,
    echo=print,
) -> list[dict[str, Any]]:
    """Run every entry with the seeds ``seed .. seed + seeds - 1``, each seed ``repeats``
    times (timing repeats: medians reported), at most ``jobs`` runs at once; write
    ``out/compare.json`` and ``out/loss_curves.png``, and return one row of figures per
    entry (with several seeds: means, and 95% bootstrap intervals under ``intervals``).
    ``data`` (a ``KIND:PATH`` source, its ``data_settings`` and ``validation_data``, see
    ``beatloop.named_data.load.load_data``) replaces every recipe's built-in data.
    ``imports``: modules (names or ``.py`` paths) imported here and in every run's
    process before its recipe is looked up (``--import``: recipes of the user's own).

    ``echo`` is handed a line as each run starts: ``run I/N: LABEL, seed S, in RUN_DIR``
    (I counting every run of the comparison). A run that fails ends its entry: the
    entry's other runs are not started (or are stopped), the other entries run on, and
    once they have ended ``compare.json`` (with the failures under ``failed``) and the
    curves of the entries that finished are written, then ``ComparisonFailed`` is
    raised, holding those entries' rows and each failure."""
    from beatloop.core.failures.errors import ConfigError
    from beatloop.user_modules import as_given_to_children, import_modules

    imports = as_given_to_children(imports)
    import_modules(imports)
    for option, value in (("--seeds", seeds), ("--jobs", jobs), ("--repeats", repeats)):
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"{option} must be a whole number >= 1, got {value!r}")
    labels = [e.label for e in entries]
    if len(set(labels)) != len(labels):
        raise BeatloopError(f"the same recipe and settings appear twice: {labels}")
    settings = {entry: (*tuned_settings(entry), *entry.settings) for entry in entries}
    _check_settings(settings)  # a wrong field fails here, before anything runs
    out.mkdir(parents=True, exist_ok=True)
    seed_list = list(range(seed, seed + seeds))
    tasks = []
    total = len(entries) * seeds * repeats
    for entry in entries:
        for each in seed_list:
            for repeat in range(repeats):
                where = f"seed{each}" if repeats == 1 else f"seed{each}-run{repeat + 1}"
                spec = {
                    "label": entry.label,
                    "recipe": entry.recipe,
                    "settings": list(settings[entry]),
                    "epochs": epochs,
                    "seed": each,
                    "steps_per_execution": steps_per_execution,
                    "run_dir": str(out / entry.slug / where),
                    "data": data,
                    "data_settings": list(data_settings),
                    "validation_data": validation_data,
                    "imports": list(imports),
                }
                timing = f", timing run {repeat + 1}/{repeats}" if repeats > 1 else ""
                what = (
                    f"run {len(tasks) + 1}/{total}: {entry.label}, seed {each}{timing}, "
                    f"in {spec['run_dir']}"
                )
                tasks.append((what, spec))
    outcomes = iter(_run_all(tasks, jobs, timeout, echo))
    rows, failures = [], []
    for entry in entries:
        runs = [[next(outcomes) for _ in range(repeats)] for _ in seed_list]
        failed = [run for seed_runs in runs for run in seed_runs if isinstance(run, RunFailure)]
        if failed:
            failures += failed
        else:
            rows.append(_summary(entry, settings[entry], seed_list, runs))
    record: dict[str, Any] = {
        "epochs": epochs,
        "seed": seed,
        "seeds": seed_list,
        "repeats": repeats,
        "rows": rows,
    }
    lead = quality_lead(rows)
    if lead is not None:
        record["quality_lead"] = lead
    if data is not None:
        record["data"] = {
            "source": data,
            "settings": list(data_settings),
            "validation": validation_data,
        }
    if failures:
        record["failed"] = [
            attrs.asdict(failure, filter=lambda field, _: field.name != "detail")
            for failure in failures
        ]
    (out / "compare.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    if rows:
        plot_loss_curves(rows, out / "loss_curves.png")
    if failures:
        raise ComparisonFailed(rows, failures)
    return rows


def _check_settings(settings: Mapping[Entry, Sequence[str]]) -> None:
    from beatloop.core.schedule.config import parse_settings
    from beatloop.plugins.registry import get_recipe

    for entry, texts in settings.items():
        cls = get_recipe(entry.recipe)
        parse_settings(texts, cls.Config, f"recipe {cls.name!r} ({entry.label})")


def _run_all(
    tasks: Sequence[tuple[str, Mapping[str, Any]]],
    jobs: int,
    timeout: float,
    echo: Callable[[str], Any],
) -> list[dict[str, Any] | RunFailure | None]:
    """Each task's figures, or its ``RunFailure``, in the tasks' order. One job: one run
    after another. More: up to ``jobs`` processes at once (their speeds then share the
    machine's cores). A failed run ends its entry's other runs (those of the same
    label): not started (``None``), or stopped; the other entries' run on."""
    results: list[dict[str, Any] | RunFailure | None] = [None] * len(tasks)
    failed: set[str] = set()  # the labels of the entries a run of which failed
    if jobs == 1:
        for index, (what, spec) in enumerate(tasks):
            if spec["label"] in failed:
                continue
            echo(f"{what} ...")
            results[index] = _run_isolated(spec, timeout)
            if isinstance(results[index], RunFailure):
                failed.add(spec["label"])
        return results
    waiting = list(enumerate(tasks))
    running: dict[int, tuple[subprocess.Popen | ForkedChild, Any, Any, float]] = {}
    try:
        while waiting or running:
            waiting = [task for task in waiting if task[1][1]["label"] not in failed]
            while waiting and len(running) < jobs:
                index, (what, spec) = waiting.pop(0)
                echo(f"{what} ...")
                running[index] = (*_start(spec), time.monotonic())
            time.sleep(0.05)
            for index, (process, stdout, stderr, started) in list(running.items()):
                spec = tasks[index][1]
                if spec["label"] in failed:  # another run of its entry failed
                    _stop(running.pop(index))
                    continue
                if process.poll() is None:
                    if time.monotonic() - started > timeout:
                        _stop(running.pop(index))
                        results[index] = _failure(spec, _timed_out(timeout))
                        failed.add(spec["label"])
                    continue
                del running[index]
                with stdout, stderr:
                    stdout.seek(0), stderr.seek(0)
                    printed, complained = stdout.read(), stderr.read()
                results[index] = _collected(spec, process.returncode, printed, complained)
                if isinstance(results[index], RunFailure):
                    failed.add(spec["label"])
    finally:
        for each in running.values():
            _stop(each)
    return results


def _stop(started: tuple[subprocess.Popen | ForkedChild, Any, Any, float]) -> None:
    """Kill a run's process and close its output files."""
    process, stdout, stderr, _ = started
    process.kill()
    process.wait()
    stdout.close(), stderr.close()


def _command(spec: Mapping[str, Any]) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    return [sys.executable, "-m", "beatloop.compare", json.dumps(spec)], env


def _start(spec: Mapping[str, Any]) -> tuple[subprocess.Popen | ForkedChild, Any, Any]:
    """A run's process, its output going to files (a pipe nobody reads while it runs
    could fill up and stall it)."""
    command, env = _command(spec)
    # closed by _run_all once the process ends (or is killed)
    stdout, stderr = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")  # noqa: SIM115
    process = popen(command, stdout=stdout, stderr=stderr, text=True, env=env)
    return process, stdout, stderr


def _timed_out(timeout: float) -> dict[str, Any]:
    return {"message": f"did not finish within {timeout:.0f} s", "exit_code": 2}


def _failure(spec: Mapping[str, Any], what: Mapping[str, Any]) -> RunFailure:
    """The ``RunFailure`` of ``spec``'s run: ``what`` as the run's process reported it
    (``ran``), or as the parent found it."""
    label = spec.get("label") or " ".join([spec["recipe"], *spec["settings"]])
    return RunFailure(label, spec["seed"], str(spec.get("run_dir", "")), **what)


def _collected(
    spec: Mapping[str, Any], code: int, stdout: str, stderr: str
) -> dict[str, Any] | RunFailure:
    """A finished run's figures, from the last line it printed; or its failure: the one
    it reported (its last line, ``{"failure": ...}``: ``ran``), else a crash (a bug's
    traceback, a signal) with the last line it wrote on standard error."""
    lines = stdout.strip().splitlines()
    if code == 0:
        return json.loads(lines[-1])
    try:
        return _failure(spec, json.loads(lines[-1])["failure"])
    except (IndexError, ValueError, KeyError, TypeError):
        pass
    if code < 0:  # killed by a signal: as a shell reports it
        import signal

        name = signal.Signals(-code).name
        ending = {"message": f"was killed by {name} (out of memory?)", "exit_code": 128 - code}
    else:
        last = (stderr.strip().splitlines() or ["(no output)"])[-1]
        ending = {"message": last, "exit_code": 1}
    return _failure(spec, {**ending, "internal": True, "detail": stderr})


def _run_isolated(spec: Mapping[str, Any], timeout: float) -> dict[str, Any] | RunFailure:
    """One run to its end (killed after ``timeout`` seconds): its figures or failure."""
    process, stdout, stderr = _start(spec)
    with stdout, stderr:
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            return _failure(spec, _timed_out(timeout))
        stdout.seek(0), stderr.seek(0)
        return _collected(spec, process.returncode, stdout.read(), stderr.read())


def _summary(
    entry: Entry, settings: Sequence[str], seeds: Sequence[int], runs: list[list[dict[str, Any]]]
) -> dict[str, Any]:
    """One entry's row: per seed, the medians of its timing repeats; over the seeds, the
    mean of each figure (with one seed, that seed's figures) and its bootstrap interval."""
    per_seed = [
        {"seed": seed, **_medians(repeats)} for seed, repeats in zip(seeds, runs, strict=True)
    ]
    first = runs[0][0]
    mean = lambda values: statistics.fmean(values)  # noqa: E731
    interval = lambda values: list(bootstrap_interval(values))  # noqa: E731
    losses = {name: [s["final_losses"][name] for s in per_seed] for name in first["final_losses"]}
    row: dict[str, Any] = {
        "label": entry.label,
        "recipe": entry.recipe,
        "settings": list(entry.settings),
        "steps": first["steps"],
        **{key: mean([s[key] for s in per_seed]) for key in FIGURES},
        "final_losses": {name: mean(values) for name, values in losses.items()},
        "quality": first["quality"],
        "quality_value": None,
        "loss_curves": {
            name: [
                mean(epoch)
                for epoch in zip(*(s["loss_curves"][name] for s in per_seed), strict=True)
            ]
            for name in first["loss_curves"]
        },
    }
    if entry.tuned is not None:
        tuned = settings[: len(settings) - len(entry.settings)]
        row["tuned"] = {"study": entry.tuned, "settings": list(tuned)}
    intervals: dict[str, Any] = {key: interval([s[key] for s in per_seed]) for key in FIGURES}
    intervals["final_losses"] = {name: interval(values) for name, values in losses.items()}
    qualities = [s["quality_value"] for s in per_seed]
    if first["quality"] is not None and None not in qualities:
        row["quality_value"] = mean(qualities)
        intervals["quality_value"] = interval(qualities)
    row.update({"seeds": list(seeds), "per_seed": per_seed, "intervals": intervals})
    return row


def _medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One seed's figures: the medians of its timing repeats, the first one's curves."""
    median = lambda key: statistics.median(r[key] for r in runs)  # noqa: E731
    first = runs[0]
    return {
        **{key: median(key) for key in FIGURES},
        "final_losses": {
            name: statistics.median(r["final_losses"][name] for r in runs)
            for name in first["final_losses"]
        },
        "quality_value": (
            None
            if first["quality"] is None or any(r["quality_value"] is None for r in runs)
            else statistics.median(r["quality_value"] for r in runs)
        ),
        "loss_curves": first["loss_curves"],
    }


# --- one run, in its own process ---------------------------------------------------------


def _resident_mb() -> float:
    """This process's resident memory now, from /proc (Linux)."""
    with open("/proc/self/statm") as handle:
        pages = int(handle.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def run_one(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Train one entry and return its figures (what the parent process collects)."""
    import beatloop
    from beatloop.core.schedule.config import parse_settings
    from beatloop.plugins.registry import get_recipe
    from beatloop.user_modules import import_modules

    import_modules(spec.get("imports", ()))
    cls = get_recipe(spec["recipe"])
    overrides = parse_settings(spec["settings"], cls.Config, f"recipe {cls.name!r}")
    timer = beatloop.TrainingTimer()
    data = None
    if spec.get("data") is not None:
        from beatloop.named_data.load import load_data

        def data(recipe, seed):
            return load_data(
                spec["data"],
                spec.get("data_settings", ()),
                recipe=recipe,
                seed=seed,
                validation=spec.get("validation_data"),
            )

    before = _resident_mb()
    result = beatloop.fit(
        cls,
        config=overrides,
        epochs=spec["epochs"],
        seed=spec["seed"],
        steps_per_execution=spec["steps_per_execution"],
        run_dir=spec["run_dir"],
        callbacks=[timer],
        progress=False,
        data=data,
    )
    beats = [beat.name for beat in result.bound.beats]
    quality = cls.quality_figure
    value = None
    if quality is not None and quality[0] in result.history:
        value = result.history[quality[0]][-1]
    steps_per_second, examples_per_second = timer.rates()
    return {
        "steps": result.steps,
        "steps_per_second": steps_per_second,
        "examples_per_second": examples_per_second,
        "peak_memory_mb": _peak_mb(),
        "memory_growth_mb": max(_peak_mb() - before, 0.0),
        "final_losses": {name: result.history[name][-1] for name in beats},
        "quality": list(quality) if quality is not None and value is not None else None,
        "quality_value": value,
        "loss_curves": {name: result.history[name] for name in beats},
    }


def ran(spec: Mapping[str, Any]) -> tuple[int, str]:
    """What a run's process exits with and prints last: 0 and its figures as JSON, or,
    for a beatloop error that ended it, the error's exit code and ``{"failure": ...}``
    (its message, without the class path, and that code) for the parent to read. An
    exception beatloop did not raise on purpose goes on (a traceback, exit code 1)."""
    from beatloop.core.failures.errors import UserCodeError

    try:
        figures = run_one(spec)
    except BeatloopError as error:
        failure = {
            "message": str(error),
            "exit_code": error.exit_code,
            "own_words": isinstance(error, UserCodeError),
        }
        return error.exit_code, json.dumps({"failure": failure})
    return 0, json.dumps(figures)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    code, last = ran(json.loads(sys.argv[1]))
    print(last)
    sys.exit(code)
