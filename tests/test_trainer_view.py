"""The trainer's helpers annotate their argument with :class:`hetgmp.train.trainer_view.TrainerView`
(not the trainer's class: that would be an import cycle); the trainer must have every member
the view lists, or a helper would fail at run time on a renamed attribute."""

from __future__ import annotations

import ast
from pathlib import Path

TRAIN = Path(__file__).resolve().parents[1] / "hetgmp" / "train"


def _class(path: Path, name: str) -> ast.ClassDef:
    tree = ast.parse(path.read_text())
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def _self_attributes(cls: ast.ClassDef) -> set[str]:
    """Methods and properties of ``cls``, and every ``self.x`` it assigns anywhere."""
    names = {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for node in ast.walk(cls):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        for t in targets:
            for leaf in ast.walk(t):
                if (
                    isinstance(leaf, ast.Attribute)
                    and isinstance(leaf.value, ast.Name)
                    and leaf.value.id == "self"
                ):
                    names.add(leaf.attr)
    return names


def test_the_trainer_has_every_member_of_its_view() -> None:
    view = _class(TRAIN / "trainer_view.py", "TrainerView")
    wanted = {n.target.id for n in view.body if isinstance(n, ast.AnnAssign)}
    wanted |= {n.name for n in view.body if isinstance(n, ast.FunctionDef)}
    assert len(wanted) > 20  # (the parse found the view)
    have = _self_attributes(_class(TRAIN / "trainer.py", "Trainer"))
    assert not wanted - have, f"TrainerView lists what Trainer lacks: {sorted(wanted - have)}"
