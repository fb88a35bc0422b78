"""``--config FILE`` for train, partition and experiment: flags > file > defaults, what a run
writes loads back as it is, and a bad key or value names the key and the file (issue 15 item 7)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
from test_train import _cfg, local_factory

from hetgmp.cli import build_parser
from hetgmp.cli import main as hetgmp_main
from hetgmp.config import from_namespace
from hetgmp.partition.cli import PartitionConfig
from hetgmp.train.config import TrainConfig


def _write(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data))
    return path


def _error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_train_flags_beat_the_file_and_the_file_beats_defaults(tmp_path) -> None:
    cfg = _write(tmp_path / "c.json", {"batch_size": 32, "lr": 0.2, "val": False, "iters": 5})
    for argv in (
        ["train", "--config", str(cfg), "--lr", "0.3"],
        ["train", "--lr", "0.3", f"--config={cfg}"],  # (a flag before the file wins too)
    ):
        a = build_parser().parse_args(argv)
        assert (a.batch_size, a.lr, a.val, a.iter, a.embed_dim) == (32, 0.3, False, 5, 16)
    a = build_parser().parse_args(["train", "--config", str(cfg), "--val"])
    assert a.val is True
    # the parser keeps no trace of the file
    a = build_parser().parse_args(["train"])
    assert (a.batch_size, a.lr, a.val, a.iter) == (1024, 0.05, True, 0)


def test_what_train_writes_loads_back_without_its_outputs(tiny_dataset, tmp_path, capsys) -> None:
    """The results file, the checkpoint manifest and the JSON-lines log each give back the
    resolved config of the run that wrote them, less that run's outputs (issue 32: re-running
    ``--config runs/result.json`` replaced the saved result and appended to its log)."""
    from hetgmp.comm.env import DistEnv
    from hetgmp.train.run import train

    cfg = _cfg(
        tiny_dataset.root,
        iter=3,
        seed=5,
        val=False,
        dense_optimizer="sgd",
        log_json=tmp_path / "log.jsonl",
        output=tmp_path / "res.json",
        checkpoint_dir=tmp_path / "ck",
    )
    train(cfg, DistEnv.single(), embedding_factory=local_factory)
    (manifest,) = (tmp_path / "ck").glob("*/manifest.json")
    no_outputs = dataclasses.replace(cfg, log_json=None, output=None, checkpoint_dir=None)
    for written in (tmp_path / "res.json", manifest, tmp_path / "log.jsonl"):
        capsys.readouterr()
        args = build_parser().parse_args(["train", "--config", str(written)])
        assert from_namespace(TrainConfig, args) == no_outputs, written
        note = capsys.readouterr().err
        assert "not reused" in note and "res.json" in note and "log.jsonl" in note, note
    # given again on the command line, they are written
    args = build_parser().parse_args(
        ["train", "--config", str(tmp_path / "res.json"), "--output", str(tmp_path / "b.json")]
    )
    assert from_namespace(TrainConfig, args).output == tmp_path / "b.json"
    # a config taken out of the results file (hand-written: taken whole), one flag changed
    plain = _write(
        tmp_path / "plain.json", json.loads((tmp_path / "res.json").read_text())["config"]
    )
    args = build_parser().parse_args(["train", "--config", str(plain), "--seed", "6"])
    assert from_namespace(TrainConfig, args) == dataclasses.replace(cfg, seed=6)


def test_rerunning_a_result_leaves_it_and_its_log_alone(tiny_dataset, tmp_path) -> None:
    """A real re-run from a results file with one flag changed: the saved result and its log
    are byte for byte what they were."""
    res, log = tmp_path / "res.json", tmp_path / "log.jsonl"
    base = ["train", "--dataset", str(tiny_dataset.root), "--iter", "2", "--batch-size", "16",
            "--device", "cpu", "--no-progress", "--no-val", "--threads", "1"]  # fmt: skip
    assert hetgmp_main([*base, "--output", str(res), "--log-json", str(log)]) == 0
    before = (res.read_bytes(), log.read_bytes())
    assert hetgmp_main(["train", "--config", str(res), "--seed", "7"]) == 0
    assert (res.read_bytes(), log.read_bytes()) == before


def test_unknown_key_names_it_the_file_and_a_close_match(tmp_path, capsys) -> None:
    bad = _write(tmp_path / "bad.json", {"batch_sise": 8})
    err = _error(["train", "--config", str(bad)], capsys)
    assert str(bad) in err and "'batch_sise'" in err and "did you mean 'batch_size'" in err
    err = _error(["partition", "--config", str(_write(tmp_path / "p.json", {"lr": 1}))], capsys)
    assert "p.json" in err and "unknown option 'lr'" in err


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("batch_size", "many", "expected an integer, got str 'many'"),
        ("batch_size", 6.5, "expected an integer, got 6.5"),
        ("val", "yes", "expected true or false"),
        ("lr", [0.1], "expected a number, got a list"),
        ("model", "xyz", "'xyz' is not one of"),
        ("dataset", 3, "expected a string, got int 3"),
        ("epochs", None, "null is not allowed"),
    ],
)
def test_wrong_type_names_the_key_and_the_file(tmp_path, capsys, key, value, says) -> None:
    bad = _write(tmp_path / "bad.json", {key: value})
    err = _error(["train", "--config", str(bad)], capsys)
    assert f"{bad}: {key}: {says}" in err, err


def test_unreadable_files_say_so(tmp_path, capsys, monkeypatch) -> None:
    err = _error(["train", "--config", str(tmp_path / "none.json")], capsys)
    assert "none.json: cannot read it" in err
    (tmp_path / "broken.json").write_text('{"lr": 0.1,')
    assert "broken.json: not valid JSON (line 1" in _error(
        ["train", "--config", str(tmp_path / "broken.json")], capsys
    )
    (tmp_path / "list.json").write_text("[1, 2]")
    assert "expected a mapping" in _error(
        ["train", "--config", str(tmp_path / "list.json")], capsys
    )
    # YAML without PyYAML: a clear way out, not an ImportError
    monkeypatch.setitem(sys.modules, "yaml", None)
    (tmp_path / "c.yaml").write_text("lr: 0.1\n")
    err = _error(["train", "--config", str(tmp_path / "c.yaml")], capsys)
    assert "c.yaml: reading YAML needs PyYAML (pip install pyyaml)" in err


def test_yaml_file(tmp_path) -> None:
    pytest.importorskip("yaml")
    (tmp_path / "c.yaml").write_text("batch_size: 32\nlr: 1e-3\nval: false\nmodel: dcn\n")
    a = build_parser().parse_args(["train", "--config", str(tmp_path / "c.yaml")])
    assert (a.batch_size, a.lr, a.val, a.model) == (32, 1e-3, False, "dcn")


def test_partition_config_round_trip_and_precedence(tiny_dataset, tmp_path, capsys) -> None:
    """``partition stats --json`` shows the resolved options, and that output loads back (less
    the plan file it describes)."""
    out = tmp_path / "p.npz"
    cfg = _write(tmp_path / "c.json", {"nparts": 3, "method": "hash", "progress": False,
                                       "data": str(tiny_dataset.root), "out": str(out)})  # fmt: skip
    assert hetgmp_main(["partition", "--config", str(cfg), "--seed", "4"]) == 0
    capsys.readouterr()
    assert hetgmp_main(["partition", "stats", str(out), "--json"]) == 0
    stats = _write(tmp_path / "stats.json", json.loads(capsys.readouterr().out))
    resolved = from_namespace(
        PartitionConfig, build_parser().parse_args(["partition", "--config", str(stats)])
    )
    # (the plan it describes is that run's output: not overwritten by a re-run, issue 32)
    assert (resolved.nparts, resolved.method, resolved.seed) == (3, "hash", 4)
    assert resolved.out == PartitionConfig().out != out
    assert resolved.batch_size == PartitionConfig().batch_size  # a default, resolved
    a = build_parser().parse_args(["partition", "--config", str(stats), "--nrank", "2"])
    assert (a.nparts, a.method) == (2, "hash")


def test_experiment_config(tmp_path, capsys) -> None:
    """The required --data / --out may come from the file; list options take a list or the
    command line's comma-separated text."""
    cfg = _write(tmp_path / "c.json", {"data": "d", "out": "o", "store_rates": [0, 0.5],
                                       "batch-size": 16, "ranks": 2})  # fmt: skip
    a = build_parser().parse_args(["experiment", "store-rate", "--config", str(cfg), "--np", "3"])
    assert (a.data, a.out, a.store_rates, a.batch_size, a.ranks) == (
        Path("d"),
        Path("o"),
        (0.0, 0.5),
        16,
        3,
    )
    cfg = _write(tmp_path / "s.json", {"data": "d", "out": "o", "bounds": "0,10"})
    assert build_parser().parse_args(["experiment", "staleness", "--config", str(cfg)]).bounds == (
        0,
        10,
    )
    bad = _write(tmp_path / "b.json", {"data": "d", "out": "o", "bounds": "x"})
    err = _error(["experiment", "staleness", "--config", str(bad)], capsys)
    assert "b.json: bounds: expected comma-separated integers" in err
    # without the file, --data is still required
    assert "--data" in _error(["experiment", "staleness", "--out", "o"], capsys)
