"""``--config FILE``: options from a YAML or JSON file, for ``train``, ``partition`` and
``experiment``.

Precedence is flags > file > defaults: the file's values become the parser's defaults before
the command line is parsed, so a flag given on the command line always wins, wherever it
stands. Keys are the option names of the resolved config (``batch_size``) or any of the
option's long spellings without the dashes (``batch-size``, ``iters``).

What ``hetgmp train`` writes loads back: a file holding a ``config`` mapping (the results file
of ``--output``, a checkpoint's ``manifest.json``, a ``partition stats --json`` dump) is read
from that mapping, and a ``--log-json`` run log from its last ``config`` record. Such a *run
record* describes a run that already wrote its outputs, so its output options
(:data:`RUN_OUTPUTS`: the results file, the log, the checkpoint directory and ``--resume``, a
plan's ``--out``) are not taken from it: re-running ``--config runs/result.json`` with one flag
changed must not replace that run's result nor append to its log (issue 32). A note on stderr
names what was left out; give the options again on the command line to write them. A
hand-written config file (no ``config`` mapping) is taken whole, outputs included.

Every parser built from :class:`ConfigFileParser` (``hetgmp``'s, and through
``add_subparsers`` every subcommand's) honours ``--config`` once :func:`add_config_option`
gave it one; the others parse as plain argparse parsers.
"""

from __future__ import annotations

import argparse
import difflib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CONFIG_FLAG = "--config"
# Options naming what a run writes: a run record's values of these are that run's outputs.
RUN_OUTPUTS = ("output", "log_json", "checkpoint_dir", "resume", "out")
_NOT_OPTIONS = {"help", "version", "config"}
_FLAG_ACTIONS = (
    argparse.BooleanOptionalAction,
    argparse._StoreTrueAction,
    argparse._StoreFalseAction,
)


class ConfigFileError(ValueError):
    """A config file cannot be read or holds a bad key or value; the message names both."""


def add_config_option(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` a ``--config FILE`` option (read by :class:`ConfigFileParser`)."""
    parser.add_argument(
        CONFIG_FLAG,
        type=Path,
        default=None,
        metavar="FILE",
        help="read options from a YAML or JSON file; options given as flags win over the file, "
        "the file over the defaults. The resolved config a run writes (its --output results "
        "file, a checkpoint's manifest.json, its --log-json log) loads too, less that run's "
        "outputs (--output, --log-json, --checkpoint-dir, --resume, --out), so a re-run does "
        "not overwrite them; give them again to write them",
    )


class ConfigFileParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that reads ``--config FILE`` before the other options."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        import sys

        argv = list(sys.argv[1:] if args is None else args)
        path = _config_path(argv) if _has_config_option(self) else None
        if path is None:
            return super().parse_known_args(argv, namespace)
        try:
            values = resolve_file(self, path)
        except ConfigFileError as err:
            self.error(str(err))
        if is_run_record(path):
            values = _without_outputs(values, path)
        saved = {a: (a.default, a.required) for a in self._actions if a.dest in values}
        try:
            for action in saved:
                action.default = values[action.dest]
                action.required = False  # (the file gave it)
            return super().parse_known_args(argv, namespace)
        finally:  # the parser stays reusable, without this file's values
            for action, (default, required) in saved.items():
                action.default, action.required = default, required

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        """As argparse's, but an unknown flag gets a "did you mean" from the options of the
        (sub)command it was given to, as a config file's unknown key does."""
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            parser = _chosen_parser(self, ns)
            names = [s for a in parser._actions for s in a.option_strings if s.startswith("--")]
            hints = []
            for tok in extras:
                flag = tok.split("=", 1)[0]
                close = difflib.get_close_matches(flag, names, n=1) if flag.startswith("-") else []
                hints.append(f"{tok} (did you mean {close[0]}?)" if close else tok)
            parser.error(f"unrecognized arguments: {' '.join(hints)}")
        return ns


def _chosen_parser(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> Any:
    """The innermost (sub)command parser that ``ns`` went through."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(ns, action.dest, None) or "")
            if chosen is not None:
                return _chosen_parser(chosen, ns)
    return parser


def _has_config_option(parser: argparse.ArgumentParser) -> bool:
    return any(CONFIG_FLAG in a.option_strings for a in parser._actions)


def _config_path(argv: Sequence[str]) -> Path | None:
    """The value of ``--config`` in ``argv`` (the last one wins, as for any option)."""
    path = None
    for i, tok in enumerate(argv):
        if tok == "--":
            break
        if tok == CONFIG_FLAG and i + 1 < len(argv):
            path = Path(argv[i + 1])
        elif tok.startswith(CONFIG_FLAG + "="):
            path = Path(tok.split("=", 1)[1])
    return path


def is_run_record(path: Path) -> bool:
    """True when ``path`` is what a run wrote (a results file, a checkpoint manifest, a run
    log, a stats dump: a ``config`` mapping or ``config`` records), not a hand-written file."""
    try:
        return _read(path)[1]
    except ConfigFileError:
        return False


def _without_outputs(values: dict[str, Any], path: Path) -> dict[str, Any]:
    """``values`` less the run record's outputs, with a note on stderr naming them."""
    import sys

    dropped = {k: v for k, v in values.items() if k in RUN_OUTPUTS and v not in (None, False)}
    if dropped:
        named = ", ".join(f"{k}={v}" for k, v in dropped.items())
        print(
            f"note: --config {path} is a run's record: its outputs ({named}) are not reused, so "
            "that run's files stay as they are; give them on the command line to write them",
            file=sys.stderr,
        )
    return {k: v for k, v in values.items() if k not in RUN_OUTPUTS}


def resolve_file(parser: argparse.ArgumentParser, path: Path) -> dict[str, Any]:
    """``{dest: value}`` from config file ``path`` for ``parser``'s options, checked and typed
    as the command line would; raise :class:`ConfigFileError` naming the file and the key."""
    data = read_config_file(path)
    by_name = option_names(parser)
    values: dict[str, Any] = {}
    given: dict[str, str] = {}
    for key, value in data.items():
        action = by_name.get(str(key))
        if action is None:
            raise ConfigFileError(f"{path}: unknown option {key!r}{_suggest(str(key), by_name)}")
        if action.dest in given:
            raise ConfigFileError(
                f"{path}: {given[action.dest]!r} and {key!r} are the same option; give one"
            )
        given[action.dest] = str(key)
        values[action.dest] = convert(action, value, f"{path}: {key}")
    return values


def option_names(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Every name a file may use for an option: its dest and its long flags without dashes,
    with ``-`` or ``_``."""
    names: dict[str, argparse.Action] = {}
    for action in parser._actions:
        if not action.option_strings or action.dest in _NOT_OPTIONS:
            continue
        names[action.dest] = action
        for flag in action.option_strings:
            if flag.startswith("--"):
                bare = flag[2:]
                names[bare] = names[bare.replace("-", "_")] = action
    return names


def _suggest(key: str, names: dict[str, argparse.Action]) -> str:
    close = difflib.get_close_matches(key, list(names), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def read_config_file(path: Path) -> dict[str, Any]:
    """The option mapping of a YAML / JSON file, a results file, a checkpoint manifest or a
    JSON-lines run log (see the module docstring)."""
    return _read(path)[0]


def _read(path: Path) -> tuple[dict[str, Any], bool]:
    """(the option mapping of ``path``, whether it is a run record)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigFileError(f"--config {path}: cannot read it ({err.strerror})") from err
    suffix = Path(path).suffix.lower()
    data = _load_yaml(path, text) if suffix in (".yaml", ".yml") else _load_json(path, text)
    if not isinstance(data, dict):
        raise ConfigFileError(f"{path}: expected a mapping of option: value, got {_kind(data)}")
    inner = data.get("config")
    if isinstance(inner, dict):  # results file, checkpoint manifest, stats dump, run-log record
        return inner, True
    return data, False


def _load_json(path: Path, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        records = _json_lines(text)
        if records is not None:
            configs = [r for r in records if isinstance(r, dict) and r.get("kind") == "config"]
            if configs:
                return configs[-1]  # (a resumed run appends; the last is the latest)
            raise ConfigFileError(f"{path}: a JSON-lines file without a config record") from err
        if Path(path).suffix.lower() not in (".json", ".jsonl"):
            return _load_yaml(path, text)
        raise ConfigFileError(
            f"{path}: not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})"
        ) from err


def _json_lines(text: str) -> list[Any] | None:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    try:
        return [json.loads(ln) for ln in lines] if len(lines) > 1 else None
    except json.JSONDecodeError:
        return None


def _load_yaml(path: Path, text: str) -> Any:
    try:
        import yaml
    except ImportError as err:
        raise ConfigFileError(
            f"{path}: reading YAML needs PyYAML (pip install pyyaml); or write the file as JSON"
        ) from err
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigFileError(f"{path}: not valid YAML ({err})") from err


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"{type(value).__name__} {value!r}"


def convert(action: argparse.Action, value: Any, where: str) -> Any:
    """``value`` from a file as option ``action`` takes it; ``where`` names file and key."""
    if value is None:
        if action.default is None and not action.required:
            return None
        raise ConfigFileError(f"{where}: null is not allowed here")
    if isinstance(action, _FLAG_ACTIONS):
        if not isinstance(value, bool):
            raise ConfigFileError(f"{where}: expected true or false, got {_kind(value)}")
        return value
    if action.nargs in ("+", "*"):
        if not isinstance(value, list):
            raise ConfigFileError(f"{where}: expected a list, got {_kind(value)}")
        return [_scalar(action, v, where) for v in value]
    return _scalar(action, value, where)


def _scalar(action: argparse.Action, value: Any, where: str) -> Any:
    tp = action.type
    out: Any  # (what the option's type makes of the value)
    if isinstance(value, (dict, bool)) or (isinstance(value, list) and tp in (int, float, str)):
        raise ConfigFileError(f"{where}: expected {_expected(tp)}, got {_kind(value)}")
    if tp in (int, float):
        if isinstance(value, float) and tp is int:
            raise ConfigFileError(f"{where}: expected an integer, got {value!r}")
        try:
            out = tp(value)  # (a string as on the command line: YAML reads 1e-3 as one)
        except ValueError as err:
            raise ConfigFileError(f"{where}: expected {_expected(tp)}, got {_kind(value)}") from err
    elif tp in (None, str, Path):
        if not isinstance(value, str):
            raise ConfigFileError(f"{where}: expected {_expected(tp)}, got {_kind(value)}")
        out = Path(value) if tp is Path else value
    else:  # the option's own parser (e.g. comma-separated numbers): a list joins with commas
        text = ",".join(str(v) for v in value) if isinstance(value, list) else str(value)
        if isinstance(tp, str):  # (a type argparse looks up by name: hetgmp's options have none)
            raise ConfigFileError(f"{where}: option type {tp!r} is not supported in a file")
        try:
            out = tp(text)
        except (argparse.ArgumentTypeError, ValueError, TypeError) as err:
            raise ConfigFileError(f"{where}: {err}") from err
    if action.choices is not None and out not in action.choices:
        raise ConfigFileError(f"{where}: {out!r} is not one of {list(action.choices)}")
    return out


def _expected(tp: Any) -> str:
    return {int: "an integer", float: "a number", Path: "a path (a string)"}.get(tp, "a string")
