"""The command line's help: it starts without torch, and every option says what it does in
plain text (issue 15 item 9)."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-X", "importtime", *argv],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip


@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "hetgmp", "--help"],
        ["-m", "hetgmp", "train", "--help"],
        ["-m", "hetgmp", "experiment", "staleness", "--help"],
        ["-m", "hetgmp", "partition", "--help"],
        ["-m", "hetgmp", "export", "--help"],
        ["-m", "hetgmp", "predict", "--help"],
        ["examples/hetuctr.py", "--help"],
    ],
)
def test_help_does_not_import_torch(argv: list[str]) -> None:
    """torch costs seconds to import; --help needs none of it (nor do the parsers)."""
    p = _run(*argv)
    assert p.returncode == 0 and "usage:" in p.stdout, p.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in p.stderr.splitlines()}
    assert "torch" not in imported and "matplotlib" not in imported


def test_the_parsers_choices_are_the_owners_names() -> None:
    """The names --help offers come from hetgmp.choices (no torch there); they must be the
    names the modules that own them accept."""
    from hetgmp import choices
    from hetgmp.data.pipeline import DATA_ON_DEVICE
    from hetgmp.embedding import EXCHANGES, REPLIES
    from hetgmp.embedding.kernels import KERNELS
    from hetgmp.models import MODELS

    assert choices.MODEL_NAMES == tuple(sorted(MODELS))
    assert (choices.REPLIES, choices.EXCHANGES) == (REPLIES, EXCHANGES)
    assert (choices.KERNELS, choices.DATA_ON_DEVICE) == (KERNELS, DATA_ON_DEVICE)


# Sphinx markup that reads as noise in a terminal: ``literal``, :role:`x`, `link`_
SPHINX = re.compile(r"``|:[a-z]+:`|`[^`]+`_")


def _parsers(parser: argparse.ArgumentParser, path: str):  # noqa: ANN202
    """``(path, parser)`` for ``parser`` and every subcommand under it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def test_every_option_has_plain_help() -> None:
    from hetgmp.cli import build_parser

    problems = []
    for path, parser in _parsers(build_parser(), "hetgmp"):
        if parser.description and SPHINX.search(parser.description):
            problems.append(f"{path}: description has markup")
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            texts = [action.help]
            if isinstance(action, argparse._SubParsersAction):
                texts = [a.help for a in action._choices_actions]
            name = f"{path} {'/'.join(action.option_strings) or action.dest}"
            if any(not t or t == argparse.SUPPRESS for t in texts):
                problems.append(f"{name}: no help text")
            elif any(SPHINX.search(t) for t in texts):
                problems.append(f"{name}: markup in {texts}")
    assert not problems, "\n".join(problems)
    assert len(list(_parsers(build_parser(), "hetgmp"))) > 15  # (the walk reached the leaves)


def test_movielens_takes_the_shared_flags() -> None:
    """``preprocess movielens --no-progress`` (every other format takes it) is accepted."""
    from hetgmp.cli import build_parser

    args = build_parser().parse_args(["preprocess", "movielens", "--out", "o", "--no-progress"])
    assert args.progress is False and args.out == Path("o")


def test_generate_does_not_import_torch(tmp_path: Path) -> None:
    """`hetgmp generate` is numpy work (its best AUC: hetgmp.metrics.roc_auc): no torch."""
    out = tmp_path / "d"
    p = _run("-m", "hetgmp", "generate", "criteo-like", "--out", str(out), "--num-samples", "300",
             "--no-progress")  # fmt: skip
    assert p.returncode == 0 and (out / "meta.json").exists(), p.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in p.stderr.splitlines()}
    assert "hetgmp.metrics" in imported and "torch" not in imported


def test_result_readers_do_not_import_torch() -> None:
    """The experiments' tables and plots read counters by name (hetgmp.counter_names): no torch."""
    code = "import sys, hetgmp.experiments.plots, hetgmp.experiments.launch; print('torch' in sys.modules)"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=ROOT)  # fmt: skip
    assert p.returncode == 0 and p.stdout.split() == ["False"], p.stdout + p.stderr[-2000:]
