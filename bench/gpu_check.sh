#!/usr/bin/env bash
# The GPU check (bench/gpu_check.py): every architecture forward + backward in float32 and bf16, one FSDP2 step,
# and the sparse models' training time at 4096 and 16384 tokens against transformers and dense SDPA, in at most
# 8 minutes. Run from the repository root (no `pip install -e` needed):
#   bash bench/gpu_check.sh --out DIR            # a CUDA machine; writes DIR/gpu_check.{json,md,log}
#   bash bench/gpu_check.sh --dry-run --out DIR  # CPU, tiny sizes (the CI test)
# Wheels in .whl/ (transformers 5.24 and what it needs that the machine lacks) are installed to /tmp/site first.
cd "$(dirname "$0")/.." || exit 1
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1 && [ -z "${GPU_CHECK_SKIP_WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
    export PYTHONPATH=/tmp/site:$PWD || exit 1
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
set -u
export TF_FAMILY_NATIVE=0 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "${PYTHON:-python3}" bench/gpu_check.py "$@"
