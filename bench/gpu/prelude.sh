# Sourced at the start of an ad-hoc command on a lent GPU machine (the repo root of the tree
# the device tool sent; carry .whl with the pymetis wheel for the image's Python 3.12:
#   pip download pymetis --only-binary=:all: --python-version 3.12 \
#     --platform manylinux_2_28_x86_64 --no-deps -d .whl
# ), e.g.  source bench/gpu/prelude.sh; bash bench/gpu/read_ahead_ab.sh ...
# It sets NVLink multicast off (mandatory on the multi-GPU machines), installs the carried
# wheels into /tmp/site, builds the native extension, checks both import, and writes what
# the machine has to $R/env.log, where R=${OUT:-/tmp/out}/r. On exit it packs $R into
# $OUT/r.tgz (one file: the device tool returns at most 8 files, 16 MiB each; keep data sets
# and other large files out of $R, e.g. WORK=/tmp/..., or the archive is left behind).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
R=${OUT:-/tmp/out}/r
mkdir -p "$R/checks"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > "$R/wheels.log" 2>&1
fi
export PYTHONPATH=$PWD:/tmp/site
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$R/build.log" 2>&1 \
  || python3 setup.py build_ext --inplace >> "$R/build.log" 2>&1
python3 -c "from hetgmp.native import native; native(); import pymetis; print('native+pymetis ok')" \
  2>&1 | tee "$R/env.log"
nvidia-smi -L >> "$R/env.log"
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$R/env.log"
_pack_results() { (cd "${OUT:-/tmp/out}" && tar czf r.tgz r && rm -rf r); }
trap _pack_results EXIT
