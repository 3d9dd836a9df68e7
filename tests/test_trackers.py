"""--report_to: the trackers accelerate supports get every metrics row and the run's flags, under
--project and --run_name (tensorboard and trackio read back here, mlflow where it is installed);
a name that is no tracker, or a tracker not installed, stops with one line."""

import json
import sys

import pytest
from conftest import run_main

TINY = ["--max_steps", "3", "--prompts_per_step", "4", "--num_generations", "2",
        "--eval_prompts", "4", "--eval_samples", "1", "--eval_steps", "0",
        "--max_completion_length", "8", "--num_threads", "1", "--save_steps", "0",
        "--prompt_pool", "16"]  # fmt: skip


def numbers(row: dict) -> dict:
    """What a tracker is sent of a metrics.jsonl row: its numbers (null, i.e. not measured, is
    left out), at its step."""
    return {k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "step"}


def tensorboard_scalars(folder) -> dict[int, dict]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    # the metrics' events file; add_hparams writes the flags to a subfolder of their own
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    rows: dict[int, dict] = {}
    for tag in events.Tags()["scalars"]:
        for event in events.Scalars(tag):
            rows.setdefault(event.step, {})[tag] = event.value
    return rows


def test_tensorboard_and_trackio_record_the_rows_of_metrics_jsonl_and_the_flags(
    tiny_base, tmp_path, monkeypatch
):
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))  # local-first: a folder, no hub
    imported = "trackio" in sys.modules
    for package in ("tensorboard", "trackio"):  # benchmarks/requirements.txt, which CI installs
        pytest.importorskip(package, reason="pip install -r benchmarks/requirements.txt")
    if imported:  # imported earlier in this process: its folder was read then
        for module in ("trackio", "trackio.utils", "trackio.sqlite_storage"):
            monkeypatch.setattr(sys.modules[module], "TRACKIO_DIR", tmp_path / "trackio")
    trackers = ["tensorboard", "trackio"]
    mlflow = None
    try:  # a heavy package, so optional here: checked where it is installed
        import mlflow

        # a local file store (MLflow 3 asks for this opt-in: its default is a database)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
        monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        trackers.append("mlflow")
    except ImportError:
        pass
    out = tmp_path / "run"
    argv = ["ra_rloo.py", "--model_name_or_path", tiny_base, "--output_dir", str(out), *TINY]
    run_main([*argv, "--report_to", ",".join(trackers), "--project", "proj", "--run_name", "r1"])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [0, 1, 2, 3]
    expected = {row["step"]: numbers(row) for row in rows}

    # tensorboard: float32 scalars in --output_dir/<--project>
    seen = tensorboard_scalars(out / "proj")
    assert set(seen) == set(expected)
    for step, row in expected.items():
        assert set(seen[step]) == set(row), step
        assert seen[step] == pytest.approx(row, rel=1e-6, abs=1e-30), step

    # trackio: the run named --run_name in project --project, with its flags as the config
    from trackio.sqlite_storage import SQLiteStorage

    logged = {entry["step"]: entry for entry in SQLiteStorage.get_logs("proj", "r1")}
    assert set(logged) == set(expected)
    for step, row in expected.items():
        assert {key: logged[step][key] for key in row} == row, step
    config = SQLiteStorage.get_run_config("proj", "r1")
    assert config["learning_rate"] == 5e-5 and config["report_to"] == ",".join(trackers)
    assert config["run_name"] == "r1" and config["max_steps"] == 3

    if mlflow is not None:
        client = mlflow.tracking.MlflowClient()
        (run,) = client.search_runs([client.get_experiment_by_name("proj").experiment_id])
        assert run.info.run_name == "r1" and run.data.params["max_steps"] == "3"
        names = {key: key.replace("@", "_at_") for row in expected.values() for key in row}
        for key, name in names.items():
            history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, name)}
            assert history == {s: row[key] for s, row in expected.items() if key in row}, key


def test_report_to_names_a_tracker_accelerate_supports_and_installed(monkeypatch):
    import importlib.util

    from common.run.logs import check_tracker

    assert check_tracker("none") is None
    assert check_tracker("all") == ["all"]
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name.startswith(("wandb", "mlflow")) else real(name, *a),
    )
    with pytest.raises(SystemExit, match=r"^--report_to mlflow: install it first \(pip install"):
        check_tracker("tensorboard, mlflow")
    with pytest.raises(SystemExit, match=r"'tensorbord' is not a tracker accelerate supports"):
        check_tracker("tensorbord")


def test_a_resume_continues_the_tracker_run(tmp_path, monkeypatch):
    from common.run.checkpoint import MARKER
    from common.run.trackers import tracker_init_kwargs

    (tmp_path / MARKER).write_text(json.dumps({"run_id": "0123abcd4567ef89"}))
    fresh = tracker_init_kwargs(tmp_path, "r1", resumed=False)
    resumed = tracker_init_kwargs(tmp_path, "r1", resumed=True)
    # wandb: the folder's run id (a resume keeps it), so one wandb run across launches
    assert (
        fresh["wandb"]
        == resumed["wandb"]
        == {
            "name": "r1",
            "id": "0123abcd4567ef89",
            "resume": "allow",
        }
    )
    trackio = pytest.importorskip("trackio", reason="pip install -r benchmarks/requirements.txt")
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    for module in ("trackio", "trackio.utils", "trackio.sqlite_storage"):
        monkeypatch.setattr(sys.modules[module], "TRACKIO_DIR", tmp_path / "trackio")
    from trackio.sqlite_storage import SQLiteStorage

    assert "resume" not in fresh["trackio"] and resumed["trackio"]["resume"] == "allow"
    # trackio, with these keywords: the resumed launch's rows land in the first launch's run
    for step, kwargs in ((1, fresh), (2, resumed)):
        run = trackio.init(project="proj", embed=False, **kwargs["trackio"])
        run.log({"loss": float(step)}, step=step)
        trackio.finish()
    assert SQLiteStorage.get_runs("proj") == ["r1"]
    assert [row["step"] for row in SQLiteStorage.get_logs("proj", "r1")] == [1, 2]
