"""Multi-hot fields when scoring (issue 34): each sample's bags pooled into one row per field.

A version-2 artifact (:mod:`hetgmp.serve.artifact`) lists its multi-hot fields and their
pooling. A request's bags are one ``(values, offsets)`` pair per multi-hot field, in the
manifest's order, in the data set's ragged layout (docs/dataset_format.md): ``values`` int64
``[E]`` global ids, ``offsets`` int64 ``[B + 1]`` from 0 to ``E``, sample ``i``'s bag
``values[offsets[i]:offsets[i + 1]]``. Every bag value's row is gathered in one lookup and
pooled by training's own function (:func:`hetgmp.models.pooling.pool`): ``sum`` adds a bag's
rows, ``mean`` divides the sum by the bag's length, and an empty bag pools to zeros under both,
as in training, so a score is the trained model's. A bag may be longer than any in training
(training pads bags to its longest one; the pooling does not depend on that width).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from hetgmp.models.pooling import pool
from hetgmp.serve.artifact import multi_hot_fields

Bags = Sequence[tuple[Any, Any]]  # per multi-hot field: (values [E], offsets [B + 1])


@dataclasses.dataclass(frozen=True)
class BagFields:
    """An artifact's multi-hot fields: names, global id ranges and pooling, in order."""

    names: tuple[str, ...]
    offsets: tuple[int, ...]
    cardinalities: tuple[int, ...]
    pooling: tuple[str, ...]

    @classmethod
    def of(cls, manifest: dict[str, Any]) -> BagFields:
        """The manifest's multi-hot fields (none for a version-1 artifact)."""
        fields = multi_hot_fields(manifest)
        return cls(
            names=tuple(str(f["name"]) for f in fields),
            offsets=tuple(int(f["offset"]) for f in fields),
            cardinalities=tuple(int(f["cardinality"]) for f in fields),
            pooling=tuple(str(f["pooling"]) for f in fields),
        )

    def __len__(self) -> int:
        return len(self.names)

    def check(
        self, bags: Bags | None, batch: int, device: torch.device, *, check_ids: bool
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``bags`` as int64 tensors on ``device``; a ``ValueError`` / ``TypeError`` naming the
        field unless every pair is a sound ragged layout of ``batch`` bags (with ``check_ids``:
        of ids inside the field's range)."""
        if not self.names:
            if bags:
                raise ValueError("this model has no multi-hot fields; pass bags=None")
            return []
        if bags is None:
            raise ValueError(
                f"the model has multi-hot fields ({', '.join(self.names)}): pass bags=[(values, "
                "offsets), ...], one pair per field in that order"
            )
        if len(bags) != len(self.names):
            raise ValueError(
                f"{len(bags)} bag pairs for the {len(self.names)} multi-hot fields "
                f"({', '.join(self.names)})"
            )
        return [self._one(k, pair, batch, check_ids, device) for k, pair in enumerate(bags)]

    def _one(
        self, k: int, pair: Any, batch: int, check_ids: bool, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        where = f"multi-hot field {self.names[k]}"
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(
                f"{where}: expected a (values, offsets) pair, got {type(pair).__name__}"
            )
        values, offsets = (torch.as_tensor(np.asarray(t)) if not torch.is_tensor(t) else t
                           for t in pair)  # fmt: skip
        for name, t in (("values", values), ("offsets", offsets)):
            if t.dim() != 1 or (t.numel() and t.dtype not in (torch.int64, torch.int32)):
                raise TypeError(
                    f"{where}: {name} must be 1-D int64 (or int32), got {t.dtype} {tuple(t.shape)}"
                )
        values, offsets = values.to(torch.int64), offsets.to(torch.int64)
        if offsets.numel() != batch + 1:
            raise ValueError(
                f"{where}: offsets has {offsets.numel()} entries, expected {batch + 1} "
                f"(one more than the {batch} samples)"
            )
        o = offsets.cpu()
        if int(o[0]) != 0 or int(o[-1]) != values.numel() or bool((o[1:] < o[:-1]).any()):
            raise ValueError(
                f"{where}: offsets must not decrease and must run from 0 to len(values) = "
                f"{values.numel()}, got {int(o[0])}..{int(o[-1])}"
            )
        if check_ids and values.numel():
            lo, hi = self.offsets[k], self.offsets[k] + self.cardinalities[k]
            bad = (values < lo) | (values >= hi)
            if bool(bad.any()):
                raise ValueError(
                    f"{where}: id {int(values[bad][0])} is outside its range [{lo}, {hi})"
                )
        return values.to(device), offsets.to(device)

    def pooled(
        self,
        lookup: Callable[[torch.Tensor], torch.Tensor],
        bags: list[tuple[torch.Tensor, torch.Tensor]],
        batch: int,
    ) -> torch.Tensor:
        """``[batch, K, D]`` float32: every field's bags pooled, their rows from ``lookup``
        (global ids ``[E]`` -> rows ``[E, D]``) in one call. ``bags`` come from :meth:`check`."""
        k = len(self.names)
        device = bags[0][0].device
        first = torch.arange(batch, device=device) * k
        # segment (sample, field) of every bag value: sample * K + field, as training's lookup
        segs = [
            torch.repeat_interleave(first + f, offsets[1:] - offsets[:-1])
            for f, (_, offsets) in enumerate(bags)
        ]
        rows = lookup(torch.cat([values for values, _ in bags]))
        mean = torch.tensor([p == "mean" for p in self.pooling], device=device).repeat(batch)
        return pool(rows, torch.cat(segs), batch * k, mean).reshape(batch, k, rows.shape[-1])

    def empty(self, batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``batch`` empty bags in every field (for warming a scorer up)."""
        return [
            (torch.zeros(0, dtype=torch.int64), torch.zeros(batch + 1, dtype=torch.int64))
            for _ in self.names
        ]


def slice_bags(
    bags: list[tuple[np.ndarray, np.ndarray]], start: int, stop: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Samples ``start:stop`` of ragged ``bags`` (offsets restarted at 0)."""
    out = []
    for values, offsets in bags:
        a, b = int(offsets[start]), int(offsets[stop])
        out.append((values[a:b], offsets[start : stop + 1] - a))
    return out


def encode_raw_bags(
    vocab: Any, names: Sequence[str], categorical: Mapping[str, Sequence[Any]], batch: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Global-id bags of raw values: per multi-hot field in ``names``, a sequence of ``batch``
    bags, each a list of raw values (``None``: an empty bag). A value the vocabulary does not
    hold takes the field's unseen id, as preprocessing gives it; an empty value inside a bag is
    refused (the readers refuse ``a||b`` too), naming the field and sample."""
    out = []
    for name in names:
        column = categorical[name]
        if len(column) != batch:
            raise ValueError(f"multi-hot field {name}: {len(column)} bags for {batch} samples")
        flat: list[Any] = []
        lengths = np.zeros(batch, np.int64)
        for i, bag in enumerate(column):
            bag = [] if bag is None else bag
            if isinstance(bag, (str, bytes)) or not isinstance(bag, (Sequence, np.ndarray)):
                raise TypeError(
                    f"multi-hot field {name}, sample {i}: a bag is a list of values, got "
                    f"{type(bag).__name__} {bag!r:.40}"
                )
            if any(v is None or (isinstance(v, str) and v == "") for v in bag):
                raise ValueError(f"multi-hot field {name}, sample {i}: an empty value in a bag")
            flat.extend(bag)
            lengths[i] = len(bag)
        offsets = np.zeros(batch + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        out.append((vocab.encode(name, vocab.keys_of(name, flat)), offsets))
    return out
