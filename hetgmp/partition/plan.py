"""The plan file (``part.npz``, format ``hetgmp-plan`` version 1): where samples and rows live.

Keys (compatible with HET-GMP's partition files)::

    data_partition    int32 [N_train]   worker of every training sample
    embed_partition   int32 [R]         owner of every embedding row
    "0" .. "n-1"      int64 [k_w]       worker w's non-owned rows by descending mirror priority
                                        (possibly truncated to a maximum mirror share)
    meta              JSON string       format/version, parts, method, seed, batch size, cost
                                        matrix, dataset fingerprint, quality statistics

A HET-GMP file (no ``meta``) loads too; its meta is then ``{"format": "hetgmp-plan",
"source": "het-gmp"}`` and fingerprint checks are skipped with only shape checks applied.
Plans are written to a temporary name and renamed, so a crash never leaves a half plan.
"""

from __future__ import annotations

import dataclasses
import json
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from hetgmp.signals import remove_stale_temps, temp_name

PLAN_FORMAT = "hetgmp-plan"
PLAN_VERSION = 1


class PlanError(ValueError):
    """A plan file is unreadable, malformed, or does not match the data / world it is used with."""


@dataclasses.dataclass
class Plan:
    """Placement of training samples and embedding rows on ``nparts`` workers."""

    data_partition: np.ndarray
    embed_partition: np.ndarray
    mirrors: list[np.ndarray]
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def nparts(self) -> int:
        return len(self.mirrors)

    @property
    def num_samples(self) -> int:
        return int(self.data_partition.shape[0])

    @property
    def num_rows(self) -> int:
        return int(self.embed_partition.shape[0])

    @property
    def fingerprint(self) -> str | None:
        return self.meta.get("dataset_fingerprint")

    def samples_of(self, worker: int) -> np.ndarray:
        """Training-sample indices assigned to ``worker``, ascending."""
        return np.flatnonzero(self.data_partition == worker)

    def rows_of(self, worker: int) -> np.ndarray:
        """Row ids owned by ``worker``, ascending."""
        return np.flatnonzero(self.embed_partition == worker)

    def mirror_rows(self, worker: int, store_rate: float) -> np.ndarray:
        """The top ``store_rate`` share of all rows from ``worker``'s priority list (HET-GMP's rule)."""
        k = int(round(store_rate * self.num_rows))
        return self.mirrors[worker][:k]

    def validate(self) -> Plan:
        """Check internal consistency; raise :class:`PlanError`."""
        n = self.nparts
        if n < 1:
            raise PlanError("plan has no workers")
        for name, arr, bound in (
            ("data_partition", self.data_partition, n),
            ("embed_partition", self.embed_partition, n),
        ):
            if arr.ndim != 1:
                raise PlanError(f"{name} must be 1-D, has shape {arr.shape}")
            if arr.size and (arr.min() < 0 or arr.max() >= bound):
                raise PlanError(f"{name} holds worker ids outside [0, {bound})")
        for w, m in enumerate(self.mirrors):
            if m.size and (m.min() < 0 or m.max() >= self.num_rows):
                raise PlanError(f"mirror list {w} holds row ids outside [0, {self.num_rows})")
        return self

    def check_matches(
        self,
        *,
        num_samples: int | None = None,
        num_rows: int | None = None,
        fingerprint: str | None = None,
        world_size: int | None = None,
        where: str = "plan",
    ) -> None:
        """Refuse a plan made for other data or another worker count, saying which differs."""
        if world_size is not None and world_size != self.nparts:
            raise PlanError(
                f"{where} was made for {self.nparts} workers but {world_size} "
                f"{'is' if world_size == 1 else 'are'} running; "
                f"re-partition with -n {world_size} or launch {self.nparts} ranks"
            )
        fp = self.fingerprint
        if fingerprint is not None and fp is not None and fp != fingerprint:
            raise PlanError(
                f"{where} was made for a data set with fingerprint {fp[:12]}..., "
                f"this data set has {fingerprint[:12]}...; re-partition for this data"
            )
        if num_rows is not None and num_rows != self.num_rows:
            raise PlanError(
                f"{where} places {self.num_rows} embedding rows, the data set has {num_rows}"
            )
        if num_samples is not None and num_samples != self.num_samples:
            raise PlanError(
                f"{where} places {self.num_samples} training samples, the data set has {num_samples}"
            )


def save_plan(plan: Plan, path: str | os.PathLike[str]) -> Path:
    """Write ``plan`` atomically (temporary name, then rename)."""
    plan.validate()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"format": PLAN_FORMAT, "version": PLAN_VERSION, "parts": plan.nparts, **plan.meta}
    arrays: dict[str, Any] = {  # (Any: np.savez types its keywords)
        "data_partition": np.asarray(plan.data_partition, dtype=np.int32),
        "embed_partition": np.asarray(plan.embed_partition, dtype=np.int32),
        "meta": np.array(json.dumps(meta, sort_keys=True, default=_json_default)),
    }
    for w, m in enumerate(plan.mirrors):
        arrays[str(w)] = np.asarray(m, dtype=np.int64)
    remove_stale_temps(path)  # what a killed earlier run of this output left
    tmp = temp_name(path)
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # (SIGTERM too: hetgmp.signals) no half-written plan stays behind
        tmp.unlink(missing_ok=True)
        raise
    return path


def _json_default(o: Any) -> Any:
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o)}")


def load_plan(path: str | os.PathLike[str]) -> Plan:
    """Load a plan file written by hetgmp or by HET-GMP's partitioner."""
    path = Path(path)
    if not path.exists():
        raise PlanError(f"{path}: plan file does not exist")
    if path.is_file() and not zipfile.is_zipfile(path):
        # (else numpy guesses a pickle and suggests allow_pickle, which is never the fix)
        raise PlanError(
            f"{path}: not a plan file, or corrupted (a plan is a .npz zip archive of arrays; "
            "this is no zip archive)"
        )
    try:
        with np.load(path, allow_pickle=False) as z:
            keys = set(z.files)
            if not {"data_partition", "embed_partition"} <= keys:
                raise PlanError(
                    f"{path}: not a plan file (needs data_partition and embed_partition)"
                )
            worker_keys = sorted((k for k in keys if k.isdigit()), key=int)
            if [int(k) for k in worker_keys] != list(range(len(worker_keys))):
                raise PlanError(f"{path}: mirror lists must be keyed 0..n-1, found {worker_keys}")
            if "meta" in keys:
                meta = json.loads(str(z["meta"]))
                if meta.get("format") != PLAN_FORMAT:
                    raise PlanError(f"{path}: meta format is {meta.get('format')!r}")
                if int(meta.get("version", 0)) > PLAN_VERSION:
                    raise PlanError(
                        f"{path}: plan version {meta['version']} is newer than supported"
                    )
            else:
                meta = {"format": PLAN_FORMAT, "version": PLAN_VERSION, "source": "het-gmp"}
            data_part = np.asarray(z["data_partition"]).astype(np.int32, copy=False).ravel()
            embed_part = np.asarray(z["embed_partition"]).astype(np.int32, copy=False).ravel()
            mirrors = [np.asarray(z[k]).astype(np.int64, copy=False).ravel() for k in worker_keys]
    except PlanError:
        raise
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, KeyError) as err:
        why = "it holds object arrays, which are never unpickled" if "pickle" in str(err) else err
        raise PlanError(f"{path}: corrupted or unreadable plan file ({why})") from err
    if not mirrors:
        nparts = int(max(data_part.max(initial=-1), embed_part.max(initial=-1))) + 1
        mirrors = [np.zeros(0, dtype=np.int64) for _ in range(nparts)]
    plan = Plan(data_part, embed_part, mirrors, meta)
    try:
        return plan.validate()
    except PlanError as err:
        raise PlanError(f"{path}: {err}") from None
