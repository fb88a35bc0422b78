"""Where :func:`~hetgmp.data.preprocess.preprocess` gets its ids from: counts or a saved vocabulary.

:class:`CountedIds` wraps the per-field maps built from pass 1's counts (a new vocabulary);
:class:`VocabIds` wraps an existing data set's vocabulary (``--vocab-from DIR``): the same
fields, offsets and ``num_embeddings`` as ``DIR``, values not in it take the field's unseen id
and are counted per field in ``meta.json``'s ``stats.values_not_in_vocabulary``.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from hetgmp.data.dataset_meta import FieldInfo
from hetgmp.data.preprocess_stream import log
from hetgmp.data.vocab import FieldVocab, KeyCounter
from hetgmp.data.vocab_files import vocab_dir
from hetgmp.data.vocab_input import VocabError
from hetgmp.data.vocab_store import Vocabulary

if TYPE_CHECKING:
    from hetgmp.data.preprocess_options import PreprocessOptions
    from hetgmp.data.preprocess_stream import RowSource

_DEFAULT_MIN_COUNT = 1
_DEFAULT_ID_ORDER = "frequency"


def id_layout(id_order: str) -> str:
    """meta.json's ``source.id_layout``: how local and global ids are assigned."""
    order = (
        "descending count, ties by key"
        if id_order == "frequency"
        else "first appearance in input order"
    )
    return (
        f"per field: kept values (count >= min_count) get 0..k-1 by {order}; values below "
        "min_count share the rare id k (present only if such values exist, or with "
        "--reserve-rare-id); a missing categorical is one more value (own id if frequent "
        "enough, else the rare id); global id = field offset + local id"
    )


class FieldIds(Protocol):
    """The field layout of the output and the local ids of a field's keys."""

    fields: list[FieldInfo]

    def local(self, f: int, keys: np.ndarray) -> np.ndarray: ...

    def source_meta(self, opt: PreprocessOptions) -> dict[str, Any]: ...

    def stats(self) -> dict[str, Any]: ...


class CountedIds:
    """Ids from this run's counts (a new vocabulary)."""

    def __init__(self, vocabs: list[FieldVocab], fields: list[FieldInfo]) -> None:
        self.vocabs = vocabs
        self.fields = fields

    def local(self, f: int, keys: np.ndarray) -> np.ndarray:
        return self.vocabs[f].lookup(keys)

    def source_meta(self, opt: PreprocessOptions) -> dict[str, Any]:
        return {
            "min_count": opt.min_count,
            "id_order": opt.id_order,
            "reserve_rare_id": opt.reserve_rare_id,
            "id_layout": id_layout(opt.id_order),
            "rare_local_id": [v.rare_id for v in self.vocabs],
            "missing_local_id": [v.missing_id for v in self.vocabs],
        }

    def stats(self) -> dict[str, Any]:
        return {
            "distinct_values": [v.num_values for v in self.vocabs],
            "rare_values": [v.num_rare_values for v in self.vocabs],
        }


class VocabIds:
    """Ids from a saved vocabulary; counts the values it does not hold, per field."""

    def __init__(self, vocab: Vocabulary) -> None:
        self.vocab = vocab
        self.fields = [FieldInfo(f.name, f.cardinality, f.offset) for f in vocab.fields]
        # Each field is mapped by one thread at a time, so per-field slots need no lock.
        self.not_in_vocab = np.zeros(vocab.num_fields, np.int64)

    def local(self, f: int, keys: np.ndarray) -> np.ndarray:
        ids, unseen = self.vocab.fields[f].encode_local(keys)
        self.not_in_vocab[f] += unseen
        return ids

    def source_meta(self, opt: PreprocessOptions) -> dict[str, Any]:
        m = self.vocab.manifest
        return {
            "vocab_from": str(self.vocab.root),
            "min_count": m["min_count"],
            "id_order": m["id_order"],
            "reserve_rare_id": m.get("reserve_rare_id", False),
            "id_layout": id_layout(m["id_order"]) + "; ids from the vocabulary of vocab_from "
            "(a value not in it takes the field's unseen_id, see vocab/manifest.json)",
            "rare_local_id": [f.rare_id for f in self.vocab.fields],
            "missing_local_id": [f.missing_id for f in self.vocab.fields],
            "unseen_local_id": [f.unseen_id for f in self.vocab.fields],
        }

    def stats(self) -> dict[str, Any]:
        no_rare = [
            f.name
            for f, n in zip(self.vocab.fields, self.not_in_vocab, strict=True)
            if n and f.rare_id is None
        ]
        if no_rare:
            log.warning(
                "preprocess: fields %s have values not in the vocabulary but no rare id; they "
                "took the missing value's (or the field's last) id. Preprocess the vocabulary's "
                "data with --reserve-rare-id to give them an id of their own.",
                ", ".join(no_rare),
            )
        return {"values_not_in_vocabulary": self.not_in_vocab.tolist()}

    def copy_files(self, root: Path) -> None:
        """The vocabulary goes with the new data set, so it is self-contained too."""
        shutil.copytree(vocab_dir(self.vocab.root), vocab_dir(root))


class GrownIds(VocabIds):
    """Ids from a saved vocabulary grown by this run's new values (``--grow-vocab``,
    :mod:`hetgmp.data.vocab_grow`): old values keep their local ids, new ones are appended."""

    def __init__(self, vocab: Vocabulary, counter: KeyCounter) -> None:
        from hetgmp.data.vocab_grow import grow_vocabulary

        super().__init__(grow_vocabulary(vocab, counter))
        grown = self.vocab.manifest["grown_from"]
        log.info(
            "preprocess: --grow-vocab added %d ids (%s) to the %d of %s",
            sum(grown["new_ids"]),
            ", ".join(
                f"{f.name} +{n}"
                for f, n in zip(self.vocab.fields, grown["new_ids"], strict=True)
                if n
            ),  # fmt: skip
            grown["num_embeddings"],
            grown["vocab_from"],
        )

    def source_meta(self, opt: PreprocessOptions) -> dict[str, Any]:
        meta = super().source_meta(opt)
        meta["id_layout"] += (
            "; grown (--grow-vocab): new values got local ids after the field's old ones, "
            "old local ids unchanged, offsets moved (vocab/manifest.json grown_from)"
        )
        return {**meta, "grown_from": self.vocab.manifest["grown_from"]}

    def copy_files(self, root: Path) -> None:
        from hetgmp.data.vocab_grow import write_grown

        write_grown(self.vocab, root)


def open_vocab_from(
    opt: PreprocessOptions, source: RowSource, test_source: RowSource | None
) -> Vocabulary | None:
    """The vocabulary of ``opt.vocab_from`` checked against the inputs (None without it)."""
    if opt.vocab_from is None:
        if opt.grow_vocab:
            raise VocabError("--grow-vocab grows the vocabulary of --vocab-from DIR; give DIR")
        return None
    vocab = Vocabulary.load(opt.vocab_from)
    m = vocab.manifest
    for option, given, default, saved in (
        ("--min-count", opt.min_count, _DEFAULT_MIN_COUNT, m["min_count"]),
        ("--id-order", opt.id_order, _DEFAULT_ID_ORDER, m["id_order"]),
    ):
        if given != default and given != saved:
            raise VocabError(
                f"{vocab.manifest_path}: {option} {given} conflicts with --vocab-from, whose "
                f"vocabulary was made with {saved}; leave {option} out"
            )
    if opt.reserve_rare_id:
        raise VocabError(
            f"{vocab.manifest_path}: --reserve-rare-id has no effect with --vocab-from (the "
            "vocabulary's ids are fixed); pass it when preprocessing the vocabulary's data"
        )
    vocab.check_source(source)
    if test_source is not None:
        vocab.check_source(test_source)
    return vocab


def add_vocab_args(p: argparse.ArgumentParser) -> None:
    """``--vocab-from`` and ``--reserve-rare-id`` of ``hetgmp preprocess <format>``."""
    p.add_argument(
        "--vocab-from",
        type=Path,
        default=None,
        metavar="DIR",
        help="encode with the vocabulary of data set DIR instead of counting: same fields and "
        "ids as DIR (so a model trained on DIR scores the output); values DIR never kept take "
        "the field's rare id",
    )
    p.add_argument(
        "--grow-vocab",
        action="store_true",
        help="with --vocab-from: values DIR's vocabulary does not hold that occur at least its "
        "min_count times here get new ids, appended after each field's old ones (old values "
        "keep theirs); for daily retraining with hetgmp train --init-from, which carries the "
        "old rows over (docs/daily.md)",
    )
    p.add_argument(
        "--reserve-rare-id",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="give every field a rare id even when no value is below --min-count, so values "
        "unseen here (a later --vocab-from, serving) get an id of their own (default: off)",
    )
