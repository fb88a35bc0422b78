"""Typed, validated configuration shared by every entry point.

A config is a frozen-free dataclass whose fields carry their help text (and optional choices /
validation) in ``metadata``. :func:`add_arguments` turns one into argparse options and
:func:`from_namespace` turns parsed options back into a validated instance, so every command line
and every Python caller goes through the same checks. Booleans become ``--flag/--no-flag``
(never argparse's broken ``type=bool``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the option."""


def option(
    default: Any = dataclasses.MISSING,
    *,
    help: str,
    choices: Sequence[Any] | None = None,
    check: Callable[[Any], bool] | None = None,
    check_msg: str = "",
    flags: Sequence[str] | None = None,
    default_factory: Any = dataclasses.MISSING,
    parse: Callable[[str], Any] | None = None,
) -> Any:
    """Declare a config field with help text and optional validation.

    ``check`` is a predicate on the value; ``check_msg`` says what a valid value is.
    ``flags`` overrides the command-line spelling (default ``--field-name``); ``parse`` turns
    its text into the value (default: the field's type).
    """
    md = {"help": help, "choices": choices, "check": check, "check_msg": check_msg, "flags": flags}
    md["parse"] = parse
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=md)
    return dataclasses.field(default=default, metadata=md)


def _base_type(tp: Any) -> tuple[Any, bool]:
    """Return (inner type, optional?) for ``X | None`` annotations."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def validate(cfg: Any) -> Any:
    """Check every field of a config dataclass; raise :class:`ConfigError` naming the field."""
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        tp, optional = _base_type(hints[f.name])
        if value is None:
            if optional:
                continue
            raise ConfigError(f"{f.name}: a value is required")
        if tp is Path and isinstance(value, str):  # (the Python API: a path given as text)
            value = Path(value)
            object.__setattr__(cfg, f.name, value)
        choices = f.metadata.get("choices")
        if choices is not None and value not in choices:
            raise ConfigError(f"{f.name}: {value!r} is not one of {list(choices)}")
        check = f.metadata.get("check")
        if check is not None and not check(value):
            raise ConfigError(f"{f.name}: {value!r} is invalid ({f.metadata.get('check_msg', '')})")
    post = getattr(cfg, "check", None)
    if callable(post):
        post()
    return cfg


def add_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add one command-line option per field of config dataclass ``cls``."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, _ = _base_type(hints[f.name])
        flags = list(f.metadata.get("flags") or [f"--{f.name.replace('_', '-')}"])
        default = (
            f.default
            if f.default is not dataclasses.MISSING
            else (f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        )
        help_text = f.metadata.get("help", "")
        if default is not None:
            help_text += f" (default: {default})"
        kwargs: dict[str, Any] = {"dest": f.name, "help": help_text, "default": default}
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kwargs = {"dest": f.name, "help": help_text, "required": True}
        if tp is bool:
            parser.add_argument(*flags, action=argparse.BooleanOptionalAction, **kwargs)
            continue
        if f.metadata.get("parse") is not None:  # (its own parser: one token, e.g. 16,8)
            kwargs["type"] = f.metadata["parse"]
        elif typing.get_origin(tp) in (list, tuple):
            (inner,) = typing.get_args(tp)[:1]
            kwargs["type"] = inner
            kwargs["nargs"] = "+"
        elif tp is Path:
            kwargs["type"] = Path
        elif tp in (int, float, str):
            kwargs["type"] = tp
        if f.metadata.get("choices") is not None:
            kwargs["choices"] = list(f.metadata["choices"])
        parser.add_argument(*flags, **kwargs)


def from_namespace(cls: type[T], ns: argparse.Namespace, **overrides: Any) -> T:
    """Build and validate a ``cls`` instance from parsed arguments."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values = {k: v for k, v in vars(ns).items() if k in names}
    values.update(overrides)
    return validate(cls(**values))


def to_dict(cfg: Any) -> dict[str, Any]:
    """JSON-friendly dict of a config (paths as strings)."""

    def conv(v: Any) -> Any:
        if isinstance(v, Path):
            return str(v)
        if isinstance(v, (list, tuple)):
            return [conv(x) for x in v]
        return v

    return {f.name: conv(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}


def to_json(cfg: Any) -> str:
    return json.dumps(to_dict(cfg), indent=2, sort_keys=True)
