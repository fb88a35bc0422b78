"""What a training run tells its user: console lines, a JSON-lines log, a progress bar.

Only rank 0 prints or writes (every rank holds a ``RunLog``; the others are silent), so callers
need no ``if rank == 0`` around logging. Console lines have a fixed, parseable shape::

    TRAIN <step>: loss 0.4712 acc 0.7801 time 1.234 speed 52011.3 ...
    EVAL <step>: val_loss 0.4690 val_acc 0.7812 val_auc 0.7634 ...

and the JSON-lines log (``--log-json``) carries the same fields, one object per line with
``"kind"`` = ``config`` / ``train`` / ``eval`` / ``info`` / ``result``.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm

from hetgmp.progress import bar_wanted, log_above_bars


def number(v: Any) -> str:
    """A value as every console line of a run prints it (TRAIN, EVAL, the summary): 4
    decimals, or 6 significant digits for the very large and the very small."""
    if isinstance(v, float):
        return f"{v:.6g}" if abs(v) >= 1e4 or (v != 0 and abs(v) < 1e-3) else f"{v:.4f}"
    return str(v)


def format_line(kind: str, step: int, fields: dict[str, Any]) -> str:
    """``KIND <step>: key value key value ...`` (the parseable console form)."""
    return f"{kind.upper()} {step}: " + " ".join(f"{k} {number(v)}" for k, v in fields.items())


class RunLog:
    """Console + JSON-lines + tqdm output of one rank (silent unless ``active``)."""

    def __init__(
        self,
        *,
        active: bool,
        json_path: Path | None = None,
        progress: bool | None = None,
        stream: TextIO | None = None,
    ) -> None:
        self.active = active
        self.stream = stream if stream is not None else sys.stdout
        self._json: TextIO | None = None
        if active and json_path is not None:
            json_path.parent.mkdir(parents=True, exist_ok=True)
            self._json = open(json_path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        # A bar only helps a person at a terminal (stderr, where it is drawn), and not under
        # mpirun, whose ranks get a pty even when the job's output goes to a file
        # (hetgmp.progress); progress=True forces it, on rank 0 only.
        self.progress = active and bar_wanted(progress)
        self._bar: tqdm | None = None
        self._redirect = contextlib.ExitStack()

    def start_bar(self, total: int, initial: int = 0) -> None:
        if self.progress:
            self._bar = tqdm(
                total=total, initial=initial, unit="step", dynamic_ncols=True, file=sys.stderr
            )
            # other modules' log lines (warnings, the data pipeline) go above the bar too
            self._redirect.enter_context(log_above_bars())

    def advance(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def _emit(self, text: str) -> None:
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def _record(self, kind: str, payload: dict[str, Any]) -> None:
        if self._json is not None:
            # "timestamp": when (unix seconds), in every record; a TRAIN record's "time" is
            # its interval's duration (seconds), as on the TRAIN line
            rec = {"kind": kind, "timestamp": time.time(), **payload}
            self._json.write(json.dumps(rec, sort_keys=False, default=str) + "\n")
            self._json.flush()

    def info(self, message: str, **fields: Any) -> None:
        """A free-form line (e.g. "no --partition: hash placement")."""
        if self.active:
            self._emit(message)
            self._record("info", {"message": message, **fields})

    def config(self, cfg: dict[str, Any]) -> None:
        if self.active:
            self._emit("config " + json.dumps(cfg, sort_keys=True, default=str))
            self._record("config", {"config": cfg})

    def metrics(self, kind: str, step: int, fields: dict[str, Any]) -> None:
        """A ``TRAIN``/``EVAL`` line and its JSON record."""
        if self.active:
            self._emit(format_line(kind, step, fields))
            self._record(kind.lower(), {"step": step, **fields})

    def result(self, fields: dict[str, Any]) -> None:
        if self.active:
            self._emit("RESULT " + json.dumps(fields, sort_keys=True, default=str))
            self._record("result", fields)

    def summary(self, lines: list[str]) -> None:
        """The end-of-run summary for people (console only: RESULT holds the same numbers)."""
        if self.active:
            for line in lines:
                self._emit(line)

    def close(self) -> None:
        self._redirect.close()
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._json is not None:
            self._json.close()
            self._json = None
