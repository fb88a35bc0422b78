"""The command line's help: it starts without torch, and every option says what it does in
plain text (issue 15 item 9)."""

from __future__ import annotations

import subprocess
import sys

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
