"""``hetgmp experiment`` checks every option before it partitions or launches (issue 32): a
bad value gets ``hetgmp train``'s own message at once, and nothing is written under --out."""

from __future__ import annotations

import pytest

from hetgmp.cli import main


def _run(capsys, tiny_dataset, out, *extra: str) -> str:
    with pytest.raises(SystemExit) as exc:
        rc = main(["experiment", *extra[:1], "--data", str(tiny_dataset.root), "--out", str(out),
                   "--ranks", "2", *extra[1:]])  # fmt: skip
        raise SystemExit(rc)
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_bad_model_refused_before_anything(capsys, tiny_dataset, tmp_path) -> None:
    out = tmp_path / "sweep"
    err = _run(capsys, tiny_dataset, out, "store-rate", "--model", "foo")
    assert "argument --model: invalid choice: 'foo'" in err
    assert not out.exists()  # no plan made, no run launched


@pytest.mark.parametrize(
    ("sweep", "flag", "value", "says"),
    [
        ("store-rate", "--store-rates", "0.1,2", "store_rate"),
        ("store-rate", "--lr", "-1", "lr"),
        ("staleness", "--bounds", "0,-3", "bound"),
        ("partition", "--methods", "metis,foo", "--methods must be among"),
    ],
)
def test_bad_value_refused_before_anything(
    capsys, tiny_dataset, tmp_path, sweep, flag, value, says
) -> None:
    out = tmp_path / "sweep"
    err = _run(capsys, tiny_dataset, out, sweep, f"{flag}={value}")
    assert says in err, err
    assert "error" in err
    assert not (out / "plans").exists() and not (out / "runs").exists()
