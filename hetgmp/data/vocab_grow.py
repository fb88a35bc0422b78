"""Vocabulary growth: ``hetgmp preprocess ... --vocab-from DIR --grow-vocab`` (issue 32).

Daily retraining encodes each new day with the model's vocabulary; values the vocabulary never
kept would all share the field's unseen id forever. With growth, a value of the new data that
``DIR``'s vocabulary does not hold and that occurs at least the vocabulary's ``min_count``
times **in the new data** gets a new local id, appended after the field's old ids (in the
vocabulary's ``id_order``: descending count, ties by key, or first appearance). So:

* every value ``DIR`` kept keeps its local id, and the rare / missing / unseen ids stay what
  they were (a value still not kept takes the same unseen id as before);
* fields are still laid out one after another (global id = offset + local id), so a field
  that grew moves the offsets of the fields after it: field ``f``'s old global id ``g`` is
  ``g - old_offset[f] + new_offset[f]`` now. ``vocab/manifest.json`` records the layout it
  grew from (``grown_from``), which is how ``hetgmp train --init-from`` carries yesterday's
  rows over to the new ids (:mod:`hetgmp.train.warm_start`).

Values below ``min_count`` on the new day are not kept (they take the unseen id), as a fresh
count would do; a value ``DIR`` had below ``min_count`` (stored nowhere) counts as new.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np

from hetgmp.data.dataset_meta import INT32_LIMIT, FieldInfo, make_fields
from hetgmp.data.vocab import MISSING_KEY, KeyCounter, build_vocab
from hetgmp.data.vocab_files import MANIFEST, vocab_dir
from hetgmp.data.vocab_store import FieldVocabulary, Vocabulary
from hetgmp.filecheck import sha256


def old_layout(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """``[{name, offset, cardinality}]`` of a vocabulary manifest's fields."""
    return [
        {"name": e["name"], "offset": int(e["offset"]), "cardinality": int(e["cardinality"])}
        for e in manifest["fields"]
    ]


def _grow_field(
    fv: FieldVocabulary, counter: KeyCounter, f: int, id_order: str, min_count: int
) -> tuple[FieldVocabulary, int]:
    """Field ``fv`` with the new data's kept values appended; (it, number of new ids)."""
    keys, counts, first = counter.field(f)
    known = np.isin(keys, np.asarray(fv.keys))
    new = build_vocab(
        keys[~known], counts[~known], None if first is None else first[~known],
        min_count=min_count, id_order=id_order,
    )  # fmt: skip
    kept = new.ids != new.rare_id if new.rare_id is not None else np.ones(new.keys.size, bool)
    n_new = int(kept.sum())
    if n_new == 0:
        return fv, 0
    all_keys = np.concatenate([np.asarray(fv.keys), new.keys[kept]])  # (disjoint key sets)
    all_ids = np.concatenate([np.asarray(fv.ids, np.int64), new.ids[kept] + fv.cardinality])
    order = np.argsort(all_keys, kind="stable")
    missing_id = fv.missing_id
    new_keys = new.keys[kept]
    if new_keys[-1] == MISSING_KEY:  # (the largest key) missing became a kept value
        missing_id = int(new.ids[kept][-1] + fv.cardinality)
    grown = FieldVocabulary(
        name=fv.name, offset=fv.offset, cardinality=fv.cardinality + n_new,
        key_scheme=fv.key_scheme, keys=all_keys[order], ids=all_ids[order],
        rare_id=fv.rare_id, missing_id=missing_id, unseen_id=fv.unseen_id,
    )  # fmt: skip
    return grown, n_new


def grow_vocabulary(vocab: Vocabulary, counter: KeyCounter) -> Vocabulary:
    """``vocab`` grown by the values ``counter`` counted (see the module docstring), in memory;
    its manifest records ``grown_from`` and the new ids per field."""
    m = vocab.manifest
    grown: list[FieldVocabulary] = []
    added: list[int] = []
    for f, fv in enumerate(vocab.fields):
        g, n = _grow_field(fv, counter, f, m["id_order"], int(m["min_count"]))
        grown.append(g)
        added.append(n)
    layout = make_fields([g.name for g in grown], [g.cardinality for g in grown])
    for g, info in zip(grown, layout, strict=True):
        g.offset = info.offset
    manifest = copy.deepcopy(m)
    manifest["num_embeddings"] = int(sum(g.cardinality for g in grown))
    manifest["grown_from"] = {
        "vocab_from": str(vocab.root),
        "num_embeddings": vocab.num_embeddings,
        "fields": old_layout(m),
        "new_ids": added,
        "rule": "values not in vocab_from's vocabulary with count >= min_count in this data "
        "got local ids appended after the field's old ones; old local ids unchanged; global "
        "id = new offset + local id",
    }
    return Vocabulary(vocab.root, manifest, grown)


def field_infos(vocab: Vocabulary) -> list[FieldInfo]:
    return [FieldInfo(f.name, f.cardinality, f.offset) for f in vocab.fields]


def write_grown(vocab: Vocabulary, root: Path) -> None:
    """Write the grown ``vocab`` as ``root/vocab/`` (the manifest's other records as they were)."""
    out = vocab_dir(root)
    out.mkdir(parents=True, exist_ok=True)
    manifest = copy.deepcopy(vocab.manifest)
    for f, (fv, e) in enumerate(zip(vocab.fields, manifest["fields"], strict=True)):
        names = {"keys": f"{f:03d}.keys.npy", "ids": f"{f:03d}.ids.npy"}
        id_dtype = np.int32 if fv.cardinality <= INT32_LIMIT else np.int64
        np.save(out / names["keys"], np.ascontiguousarray(fv.keys, dtype=np.uint64))
        np.save(out / names["ids"], np.ascontiguousarray(fv.ids, dtype=id_dtype))
        e.update({
            "offset": fv.offset, "cardinality": fv.cardinality, "missing_id": fv.missing_id,
            "num_keys": int(np.asarray(fv.keys).size), "keys_file": names["keys"],
            "ids_file": names["ids"],
            "sha256": {k: sha256(out / n) for k, n in names.items()},
        })  # fmt: skip
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2))


def growth_of(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """The ``grown_from`` record of a vocabulary manifest (None: not grown)."""
    g = manifest.get("grown_from")
    return g if isinstance(g, dict) else None
