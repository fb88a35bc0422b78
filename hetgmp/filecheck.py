"""Files listed in a manifest: their SHA-256 and the check that they are all there, whole.

Shared by checkpoints (:mod:`hetgmp.train.checkpoint`), serving artifacts
(:mod:`hetgmp.serve.artifact`), saved vocabularies and plan fingerprints, so every one names the
bad file the same way."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any


def sha256(path: Path) -> str:
    """Hex SHA-256 of a file, read in 4 MiB chunks (bounded memory)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def file_record(path: Path) -> dict[str, Any]:
    """``{"bytes", "sha256"}`` of a file, as manifests list them."""
    return {"bytes": path.stat().st_size, "sha256": sha256(path)}


def inside(root: Path, rel: Any, error: type[Exception], *, where: str) -> Path:
    """``root / rel`` for a path a manifest names, refused (``error`` naming ``where``) unless it
    is a relative path that stays inside ``root``: no absolute path, no ``..``, no symbolic
    link leading out. A manifest is data a user hands us; it must not point at other files."""
    if not isinstance(rel, str) or not rel:
        raise error(f"{where}: file name {rel!r} is not a non-empty string")
    parts = Path(rel).parts
    if Path(rel).is_absolute() or "\\" in rel or ".." in parts:
        raise error(f"{where}: file name {rel!r} points outside {root} (refused)")
    p = Path(root) / rel
    if p.exists() and not p.resolve().is_relative_to(Path(root).resolve()):
        raise error(f"{where}: {rel!r} is a link that leads outside {root} (refused)")
    return p


def check_listed(
    root: Path, files: dict[str, dict[str, Any]], error: type[Exception], *, what: str,
    checksums: bool = True,
) -> None:  # fmt: skip
    """Raise ``error`` naming the file unless every file of ``files`` (relative to ``root``:
    ``{"bytes", "sha256"}``) exists with its size and, with ``checksums``, its SHA-256.
    ``what`` names the container in the message (e.g. ``"checkpoint DIR"``)."""
    for rel, rec in files.items():
        p = inside(root, rel, error, where=f"the manifest of {what}")
        if not p.is_file():
            raise error(f"{p}: missing from {what}")
        size = p.stat().st_size
        if size != rec["bytes"]:
            raise error(
                f"{p}: {size} bytes, the manifest records {rec['bytes']} (truncated or replaced)"
            )
        if checksums and sha256(p) != rec["sha256"]:
            raise error(f"{p}: SHA-256 differs from the manifest (corrupted or replaced)")
