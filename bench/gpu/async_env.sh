# Sourced by the async GPU scripts (async_smoke.sh, async_ab.sh), in the repo root, with PY, OUT
# and log() set: NVLink multicast off, pyzmq from the carried wheels in .whl/ when the image has
# none (see README.md), this checkout on PYTHONPATH; returns 2 without pyzmq.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if ! $PY -c "import zmq" 2> /dev/null && compgen -G ".whl/*.whl" > /dev/null; then
  log "installing carried wheels: $(ls .whl/*.whl | xargs -n1 basename | tr '\n' ' ')"
  $PY -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl \
    > "$OUT/async_wheels.log" 2>&1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if ! $PY -c "import zmq"; then
  log "FAILED: no pyzmq (carry its wheel in .whl/, see bench/gpu/README.md)"
  return 2
fi
