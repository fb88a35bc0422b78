"""The serving artifact's layout, manifest and checksums (no torch: ``--help`` stays light).

``MODEL_DIR/`` (format ``hetgmp-serving``; docs/serving.md)::

    manifest.json      written last: format, version, model, shapes, dtype, row map, and
                       every other file's size and SHA-256
    dense.safetensors  the dense part's weights (what loading reads: no unpickling); the model
                       is rebuilt from the manifest's model, num_fields, num_dense, embed_dim
                       (and field_dims)
    dense.pt2          the dense part as a torch.export program (rows [B, F, D], dense [B, n])
                       -> logits [B, 1], dynamic batch; unpickled only with trust_program=True
    dense.onnx         the same module through torch.onnx (absent when onnx is not installed;
                       the manifest says why)
    rows.safetensors   "rows" [R, D] (fp32 / bf16 / fp16); with --min-count also "index"
                       int64 [num_rows] (global id -> row of "rows"); "counts" int64 [num_rows]
                       when training access counts are known
    config.json        the resolved training config of the checkpoint
    vocab/             the dataset's vocabulary (docs/dataset_format.md), when it had one

Versions: 1, every field single-hot; 2 (:data:`MULTI_HOT_VERSION`) adds the manifest's
``multi_hot`` list (each multi-hot field's name, offset, cardinality and pooling), whose pooled
rows follow the single-hot rows in the dense part's input (``[B, F + K, D]``); 3
(:data:`FIELD_DIMS_VERSION`) adds ``field_dims``, each of those ``F + K`` fields' dimension
(the model reads its first ``d_f`` columns of the ``D``-wide rows; ``multi_hot`` optional). An
artifact is written at the lowest version that holds it, so an older hetgmp keeps loading what
it can score, and refuses a newer one with "upgrade hetgmp" rather than scoring without its bags
or building its model at the wrong widths.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hetgmp.choices import POOLINGS
from hetgmp.filecheck import check_listed, sha256

ARTIFACT_FORMAT = "hetgmp-serving"
ARTIFACT_VERSION = 3  # the newest this hetgmp reads (writes the lowest that holds the model)
MULTI_HOT_VERSION = 2
FIELD_DIMS_VERSION = 3
MANIFEST = "manifest.json"
PROGRAM = "dense.pt2"
DENSE = "dense.safetensors"
ONNX = "dense.onnx"
ROWS = "rows.safetensors"
CONFIG = "config.json"
VOCAB = "vocab"
DTYPES = ("fp32", "bf16", "fp16")


class ArtifactError(ValueError):
    """A serving artifact is missing, corrupted, foreign or newer than supported; names the file."""


def file_records(root: Path) -> dict[str, dict[str, Any]]:
    """``{relative path: {bytes, sha256}}`` of every file under ``root`` but the manifest."""
    out: dict[str, dict[str, Any]] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and rel not in (MANIFEST, f".{MANIFEST}.tmp"):
            out[rel] = {"bytes": p.stat().st_size, "sha256": sha256(p)}
    return out


def _umask() -> int:
    mask = os.umask(0o022)  # (reading it means setting it: put it straight back)
    os.umask(mask)
    return mask


def normalize_modes(root: Path) -> None:
    """Give every file under ``root`` the mode a plain ``open`` would (0644 under umask 022):
    safetensors writes 0600, which left ``rows.safetensors`` unreadable to the serving user
    while every other file of the artifact was readable."""
    mode = 0o666 & ~_umask()
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink():
            p.chmod(mode)


def write_manifest(root: Path, manifest: dict[str, Any]) -> Path:
    """Add the file records and write ``manifest.json`` atomically (it is written last); every
    file gets the umask's mode (:func:`normalize_modes`)."""
    normalize_modes(root)
    version = 1
    if manifest.get("field_dims"):
        version = FIELD_DIMS_VERSION
    elif manifest.get("multi_hot"):
        version = MULTI_HOT_VERSION
    full = {"format": ARTIFACT_FORMAT, "version": version, **manifest}
    full["files"] = file_records(root)
    tmp = root / f".{MANIFEST}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(full, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / MANIFEST)
    return root / MANIFEST


def read_manifest(root: Path) -> dict[str, Any]:
    """The manifest of ``root``, checked for format and version (not the files yet)."""
    mpath = Path(root) / MANIFEST
    if not Path(root).is_dir():
        raise ArtifactError(f"{root}: serving artifact directory does not exist")
    try:
        m = json.loads(mpath.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ArtifactError(f"{mpath}: missing; {root} is not a serving artifact") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ArtifactError(f"{mpath}: not valid JSON, truncated or corrupted ({err})") from err
    if not isinstance(m, dict) or m.get("format") != ARTIFACT_FORMAT:
        got = m.get("format") if isinstance(m, dict) else None
        raise ArtifactError(
            f"{mpath}: not a hetgmp serving artifact (format {got!r}, expected "
            f"{ARTIFACT_FORMAT!r}); make one with `hetgmp export CHECKPOINT --out DIR`"
        )
    version = m.get("version")
    if not isinstance(version, int) or version > ARTIFACT_VERSION:
        raise ArtifactError(
            f"{mpath}: artifact version {version!r} is newer than this hetgmp supports "
            f"({ARTIFACT_VERSION}); upgrade hetgmp"
        )
    for key in ("files", "model", "num_rows", "table_dim", "num_fields", "num_dense", "dtype"):
        if key not in m:
            raise ArtifactError(f"{mpath}: malformed, lacks {key!r}")
    _check_multi_hot(mpath, m)
    _check_field_dims(mpath, m)
    return m


def _check_multi_hot(mpath: Path, m: dict[str, Any]) -> None:
    """A version-2 manifest's ``multi_hot`` entries are sound (a version-1 one has none)."""
    entries = m.get("multi_hot")
    if m["version"] < MULTI_HOT_VERSION:
        if entries:
            raise ArtifactError(
                f"{mpath}: malformed, version {m['version']} with multi-hot fields (those are "
                f"version {MULTI_HOT_VERSION})"
            )
        return
    if entries is None and m["version"] >= FIELD_DIMS_VERSION:
        return  # (version 3 need not have multi-hot fields)
    if not isinstance(entries, list) or not entries:
        raise ArtifactError(f"{mpath}: malformed, version {m['version']} lacks 'multi_hot'")
    for i, e in enumerate(entries):
        ok = isinstance(e, dict) and all(
            isinstance(e.get(k), int) and e[k] >= 0 for k in ("offset", "cardinality")
        )
        if not ok or not isinstance(e.get("name"), str) or e.get("pooling") not in POOLINGS:
            raise ArtifactError(
                f"{mpath}: malformed multi_hot[{i}] {e!r}: expected name, offset, cardinality "
                f"and pooling (one of {', '.join(POOLINGS)})"
            )


def _check_field_dims(mpath: Path, m: dict[str, Any]) -> None:
    """A version-3 manifest's ``field_dims`` give one dimension in ``[1, embed_dim]`` to each
    field the dense part takes (single-hot, then multi-hot); an older one has none."""
    dims = m.get("field_dims")
    if m["version"] < FIELD_DIMS_VERSION:
        if dims is not None:
            raise ArtifactError(
                f"{mpath}: malformed, version {m['version']} with field_dims (those are "
                f"version {FIELD_DIMS_VERSION})"
            )
        return
    if dims is None:
        raise ArtifactError(f"{mpath}: malformed, version {m['version']} lacks 'field_dims'")
    width, count = m.get("embed_dim"), m.get("num_fields")
    if isinstance(count, int):
        count += len(multi_hot_fields(m))
    ok = (
        isinstance(width, int)
        and isinstance(dims, list)
        and len(dims) == count
        and all(isinstance(d, int) and 1 <= d <= width for d in dims)
    )
    if not ok:
        raise ArtifactError(
            f"{mpath}: malformed field_dims {dims!r}: expected {count!r} dimensions (single-hot "
            f"fields, then multi-hot ones), each in [1, embed_dim = {width!r}]"
        )


def field_dims(manifest: dict[str, Any]) -> list[int] | None:
    """Each field's dimension (single-hot fields, then multi-hot ones); None in versions 1 and
    2, where every field has ``embed_dim``."""
    dims = manifest.get("field_dims")
    return [int(d) for d in dims] if dims else None


def multi_hot_fields(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The manifest's multi-hot fields (name, offset, cardinality, pooling); [] in version 1."""
    return list(manifest.get("multi_hot") or [])


def model_fields(manifest: dict[str, Any]) -> int:
    """Rows per sample the dense part takes: the single-hot fields, then one pooled row per
    multi-hot field."""
    return int(manifest["num_fields"]) + len(multi_hot_fields(manifest))


def verify_files(root: Path, manifest: dict[str, Any], *, checksums: bool = True) -> None:
    """Every file the manifest lists exists with its size (and SHA-256 when ``checksums``)."""
    check_listed(
        root, manifest["files"], ArtifactError, what=f"serving artifact {root}",
        checksums=checksums,
    )  # fmt: skip
    if ROWS not in manifest["files"]:
        raise ArtifactError(f"{Path(root) / MANIFEST}: lists no {ROWS}")


def dense_file(root: Path, manifest: dict[str, Any], *, trust_program: bool) -> str:
    """The file the dense part is loaded from: ``dense.safetensors`` (never unpickled), or with
    ``trust_program`` the exported program ``dense.pt2`` (unpickled: it can run code)."""
    name = PROGRAM if trust_program else DENSE
    if name in manifest["files"]:
        return name
    if trust_program:
        raise ArtifactError(f"{Path(root) / MANIFEST}: lists no {PROGRAM}")
    raise ArtifactError(
        f"{Path(root) / MANIFEST}: lists no {DENSE} (exported by an older hetgmp, whose only "
        f"dense part is the pickled program {PROGRAM}); re-export it with `hetgmp export`, or, "
        "only if you trust whoever made this artifact, load it with trust_program=True "
        "(hetgmp predict --trust-program): unpickling the program can run arbitrary code"
    )
