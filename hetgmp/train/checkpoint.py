"""Checkpoints: written by all ranks into a temporary directory, committed by one rename.

Layout of ``<checkpoint-dir>/step-00001234/``::

    manifest.json            format/version, step, data position, world size, config, model
                             shape, dataset and plan fingerprints, and for every file its size
                             and SHA-256 (written last)
    dense.pt                 dense parameters + dense optimizer state (rank 0; they are replicated)
    embedding-<r>.pt         rows owned by rank r, keyed by global id, with their optimizer state
    rng-<r>.pt               torch / numpy RNG states of rank r

``<checkpoint-dir>/latest`` names the newest committed checkpoint; it is replaced atomically after
the rename, so a crash at any point leaves the previous checkpoint usable. Because rows are keyed
by global id, a checkpoint loads under another worker count or plan: every rank reads all
``embedding-*.pt`` files and the embedding keeps the rows it owns. All ranks must see the same
file system (one host, or a shared mount).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hetgmp.comm.collectives import all_gather_object, barrier
from hetgmp.comm.env import DistEnv
from hetgmp.filecheck import check_listed, sha256

CKPT_FORMAT = "hetgmp-checkpoint"
CKPT_VERSION = 1
MANIFEST = "manifest.json"
LATEST = "latest"


class CheckpointError(ValueError):
    """A checkpoint is missing, truncated, corrupted or made for another run; names the file."""


@dataclasses.dataclass
class Position:
    """Where training stands: global steps done, and the epoch / batch the next step reads."""

    step: int = 0
    epoch: int = 0
    batch: int = 0
    world_size: int = 1


def _tensors(obj: Any) -> Any:
    """numpy arrays -> tensors, recursively, so files load with ``weights_only=True``."""
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(obj))
    if isinstance(obj, dict):
        return {k: _tensors(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_tensors(v) for v in obj)
    return obj


def _save(obj: Any, path: Path) -> dict[str, Any]:
    with open(path, "wb") as f:
        torch.save(_tensors(obj), f)
        f.flush()
        os.fsync(f.fileno())
    return {"bytes": path.stat().st_size, "sha256": sha256(path)}


def rng_state() -> dict[str, Any]:
    np_state = np.random.get_state(legacy=False)  # (the legacy tuple's fields, by name)
    return {
        "torch": torch.get_rng_state(),
        "numpy": {
            "key": np_state["state"]["key"],
            "pos": int(np_state["state"]["pos"]),
            "gauss": [int(np_state["has_gauss"]), float(np_state["gauss"])],
        },
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    key = n["key"].numpy() if isinstance(n["key"], torch.Tensor) else np.asarray(n["key"])
    np.random.set_state(("MT19937", key.astype(np.uint32), n["pos"], n["gauss"][0], n["gauss"][1]))


def save_checkpoint(
    root: Path,
    env: DistEnv,
    *,
    position: Position,
    dense_state: dict[str, Any],
    embedding_state: dict[str, Any],
    info: dict[str, Any],
    keep: int = 2,
) -> Path:
    """Write one checkpoint (collective: every rank calls it with its own ``embedding_state``).

    ``dense_state`` is taken from rank 0 only. ``info`` (config, model shape, fingerprints) goes
    into the manifest. Older checkpoints beyond the newest ``keep`` are removed.
    """
    name = f"step-{position.step:08d}"
    final = root / name
    tmp = root / f".{name}.tmp"
    if env.is_main:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)  # left by a crash
        tmp.mkdir()
    barrier(env)
    files: dict[str, dict[str, Any]] = {}
    files[f"embedding-{env.rank}.pt"] = _save(embedding_state, tmp / f"embedding-{env.rank}.pt")
    files[f"rng-{env.rank}.pt"] = _save(rng_state(), tmp / f"rng-{env.rank}.pt")
    if env.is_main:
        files["dense.pt"] = _save(dense_state, tmp / "dense.pt")
    every = all_gather_object(env, files)
    if env.is_main:
        manifest = {
            "format": CKPT_FORMAT,
            "version": CKPT_VERSION,
            "name": name,
            "position": dataclasses.asdict(position),
            "world_size": env.world_size,
            "files": {k: v for d in every for k, v in d.items()},
            **info,
        }
        with open(tmp / MANIFEST, "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=2, sort_keys=True, default=str)
            f.flush()
            os.fsync(f.fileno())
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        latest_tmp = root / f".{LATEST}.tmp"
        latest_tmp.write_text(name + "\n")
        os.replace(latest_tmp, root / LATEST)
        _prune(root, keep)
    barrier(env)
    return final


def _prune(root: Path, keep: int) -> None:
    done = sorted(p for p in root.glob("step-*") if (p / MANIFEST).exists())
    for old in done[: max(0, len(done) - keep)]:
        shutil.rmtree(old, ignore_errors=True)


@dataclasses.dataclass
class LoadedCheckpoint:
    """A verified checkpoint directory; files are read on demand."""

    path: Path
    manifest: dict[str, Any]

    @property
    def position(self) -> Position:
        return Position(**self.manifest["position"])

    def _load(self, name: str) -> Any:
        p = self.path / name
        try:
            return torch.load(p, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 - any unpickling failure means a bad file
            raise CheckpointError(f"{p}: unreadable checkpoint file ({err})") from err

    def dense(self) -> dict[str, Any]:
        return self._load("dense.pt")

    def rng(self, rank: int) -> dict[str, Any] | None:
        name = f"rng-{rank}.pt"
        return self._load(name) if name in self.manifest["files"] else None

    def _embedding_files(self) -> list[str]:
        return sorted(
            (n for n in self.manifest["files"] if n.startswith("embedding-")),
            key=lambda n: int(n[len("embedding-") : -3]),
        )

    def embedding_shards(self) -> Iterator[tuple[Path, dict[str, torch.Tensor]]]:
        """Every rank's shard of the table, one at a time and in rank order, as ``(file,
        state)``: ``state`` holds ``ids`` (global ids), ``weight`` ``[len(ids), table_dim]``,
        ``opt_state`` and, when recorded, ``counts``, memory-mapped (only what is indexed is
        read). Shards hold disjoint ids whose union is the table, whatever the rank count; a
        shard that is not a table's is a :class:`CheckpointError` naming the file."""
        for name in self._embedding_files():
            yield self.path / name, self._load_mapped(name)

    def embedding_union(self) -> dict[str, Any]:
        """All ranks' rows concatenated: ``{"ids", "weight", "opt_state"}`` keyed by global id."""
        return merge_embedding_states([self._load(n) for n in self._embedding_files()])

    def embedding_rows(self, wanted: torch.Tensor) -> dict[str, torch.Tensor]:
        """Only the rows ``wanted`` (global ids) of a distributed table's checkpoint, as
        ``{"ids", "weight", "opt_state"}`` (ids missing from every shard are absent: the table
        says which). Each shard is memory-mapped and only these rows are read from it, so a
        rank loads what it stores, not the whole table 8 times over on an 8-rank host; a
        shard's ids (8 bytes a row) are read whole, one shard at a time."""
        wanted = torch.as_tensor(wanted).to(torch.int64).cpu().reshape(-1)
        got: dict[str, list[torch.Tensor]] = {"ids": [], "weight": [], "opt_state": []}
        for name in self._embedding_files():
            sd = self._load_mapped(name)
            ids = sd["ids"].to(torch.int64)
            if ids.numel() == 0:
                continue
            order = torch.argsort(ids)
            pos = torch.searchsorted(ids[order], wanted).clamp(max=ids.numel() - 1)
            hit = ids[order][pos] == wanted
            take = order[pos[hit]]
            got["ids"].append(wanted[hit])
            got["weight"].append(sd["weight"][take])
            state = sd["opt_state"]
            got["opt_state"].append(state[take] if state.numel() else state)
        return {k: torch.cat(v) if v else torch.zeros(0) for k, v in got.items()}

    def _load_mapped(self, name: str) -> dict[str, torch.Tensor]:
        p = self.path / name
        try:
            sd = torch.load(p, map_location="cpu", weights_only=True, mmap=True)
        except Exception as err:  # noqa: BLE001 - any unpickling failure means a bad file
            raise CheckpointError(f"{p}: unreadable checkpoint file ({err})") from err
        if not isinstance(sd, dict) or not {"ids", "weight", "opt_state"} <= set(sd):
            raise CheckpointError(f"{p}: not a distributed table's shard (ids, weight, opt_state)")
        return sd


def merge_embedding_states(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Concatenate per-rank embedding state dicts along the row axis (tensors, or dicts of them)."""

    def cat(values: list[Any]) -> Any:
        if isinstance(values[0], torch.Tensor):
            return torch.cat(values, dim=0) if values[0].dim() > 0 else values[0]
        if isinstance(values[0], dict):
            return {k: cat([v[k] for v in values]) for k in values[0]}
        return values[0]

    return {k: cat([p[k] for p in parts]) for k in parts[0]}


def find_checkpoint(path: Path) -> Path:
    """The checkpoint directory named by ``path``: itself, or the one ``path/latest`` names."""
    if (path / MANIFEST).exists():
        return path
    latest = path / LATEST
    if latest.exists():
        name = latest.read_text().strip()
        if not name or "/" in name:
            raise CheckpointError(f"{latest}: does not name a checkpoint ({name!r})")
        return path / name
    raise CheckpointError(f"{path}: no checkpoint found (neither {MANIFEST} nor {LATEST})")


def open_checkpoint(path: Path, *, verify: bool = True) -> LoadedCheckpoint:
    """Open and verify a checkpoint: format, and every file's size and SHA-256."""
    ck = find_checkpoint(Path(path))
    mpath = ck / MANIFEST
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{mpath}: missing; {ck} is not a complete checkpoint") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{mpath}: not valid JSON, truncated or corrupted ({err})") from err
    if not isinstance(manifest, dict) or manifest.get("format") != CKPT_FORMAT:
        got = manifest.get("format") if isinstance(manifest, dict) else None
        raise CheckpointError(f"{mpath}: not a hetgmp checkpoint (format {got!r})")
    if int(manifest.get("version", -1)) > CKPT_VERSION:
        raise CheckpointError(f"{mpath}: version {manifest['version']} is newer than supported")
    for key in ("position", "files"):
        if key not in manifest:
            raise CheckpointError(f"{mpath}: malformed, lacks {key!r}")
    check_listed(ck, manifest["files"], CheckpointError, what=f"checkpoint {ck}", checksums=verify)
    return LoadedCheckpoint(ck, manifest)


def check_compatible(
    ck: LoadedCheckpoint, expected: dict[str, Any], *, dataset: Path | str | None = None
) -> None:
    """Refuse a checkpoint of another model / data set, naming what differs; for the data set,
    which one each fingerprint belongs to (``dataset``: this run's directory)."""
    for key, want in expected.items():
        have = ck.manifest.get(key)
        if have == want:
            continue
        if key == "dataset_fingerprint":
            theirs = (ck.manifest.get("config") or {}).get("dataset", "?")
            raise CheckpointError(
                f"{ck.path / MANIFEST}: made for another data set: {theirs} (fingerprint "
                f"{str(have)[:12]}...); this run's data set {dataset or ''} has fingerprint "
                f"{str(want)[:12]}.... Data encoded with --vocab-from continues training "
                "through --init-from, not --resume"
            )
        raise CheckpointError(
            f"{ck.path / MANIFEST}: made for {key}={have!r}, this run has {key}={want!r}"
        )
