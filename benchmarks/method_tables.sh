#!/usr/bin/env bash
# The 3-seed result tables of the method issues, each next to its baselines in the same
# setting. Resumable (each sweep skips finished runs and resumes interrupted ones).
#   bash benchmarks/method_tables.sh [OUT_ROOT] [SECTION...]
# Sections: label-skew, per-domain, lodo, segmentation, perada, personalized, uda.
# CPU budget: each 30-round digits-dg run takes ~3 min on 2 idle cores with the default cnn
# (CCST ~3x, FedADG at official sizes much more); a GPU (--set device=cuda) is ~20x faster.
set -euo pipefail
root=${1:-runs/tables}; shift || true
sections=${*:-label-skew per-domain lodo segmentation perada personalized uda}
seeds=0,1,2
targets=mnist,mnistm,optdigits,syn
skew=(--protocol personalized -d digits-dg:mnist --set partition=nway-kshot
      --set clients_per_domain=20 --set ways=3 --set shots=15 --set stdev=2
      --set model=fedproto-cnn --set batch_size=8 --set local_epochs=2)

for section in $sections; do
  case $section in
    label-skew)  # FedProto / BD-FedProto / MOON vs FedAvg and local, N-way K-shot (issue 3)
      fedshift sweep -a fedproto,bd-fedproto,moon,fedavg,local -t clients --seeds $seeds \
        --rounds 50 "${skew[@]}" --out "$root/label-skew" --quiet
      fedshift sweep -a fedproto,local -t clients --seeds $seeds --rounds 50 "${skew[@]}" \
        --set hetero_models=fedproto --out "$root/label-skew-hetero" --quiet ;;
    per-domain)  # FPL vs FedAvg, every domain trains and is tested (issue 3)
      fedshift sweep -a fpl,fedavg,local -t all --protocol per-domain --seeds $seeds --rounds 30 \
        --set clients_per_domain=5 --set client_data_fraction=0.3 --out "$root/per-domain" --quiet ;;
    lodo)  # leave-one-domain-out methods vs FedAvg (issues 3 and 6)
      fedshift sweep -a fedavg,local,fedsr,moon,ccst,feddg-elcfs,fedga,fedadg,ditto \
        -t $targets --seeds $seeds --rounds 30 --out "$root/lodo" --quiet ;;
    segmentation)  # FedDG-ELCFS vs FedAvg on digit-foreground segmentation, Dice (issue 6)
      fedshift sweep -a fedavg,feddg-elcfs -t $targets --seeds $seeds --rounds 30 \
        --set task=segmentation --set model=unet --out "$root/segmentation" --quiet ;;
    perada)  # PerAda on a backbone pretrained on syn, which then stays out of the federation
      mkdir -p "$root/backbones"
      [ -f "$root/backbones/cnn-syn.pt" ] || \
        fedshift pretrain --domain syn --out "$root/backbones/cnn-syn.pt" --epochs 10
      for t in mnist mnistm optdigits; do
        s=$(echo mnist,mnistm,optdigits | tr , '\n' | grep -vx "$t" | paste -sd,)
        fedshift sweep -a perada -t "$t" --seeds $seeds --rounds 30 --set sources="$s" \
          --set server_data=syn --set algo.backbone="$root/backbones/cnn-syn.pt" \
          --out "$root/perada" --quiet
        fedshift sweep -a fedavg -t "$t" --seeds $seeds --rounds 30 --set sources="$s" \
          --set model_weights="$root/backbones/cnn-syn.pt" --out "$root/perada-fedavg" --quiet
      done ;;
    personalized)  # Ditto / PerAda personalized accuracy vs FedAvg and local
      fedshift sweep -a fedavg,ditto,local --protocol personalized -t clients --seeds $seeds \
        --rounds 30 --set sources=mnist,mnistm,optdigits --set clients_per_domain=2 \
        --set partition=dirichlet --out "$root/personalized" --quiet ;;
    uda)  # FACT / FACT-NF / FADA vs source-only references (issue 5)
      bash "$(dirname "$0")/uda_table.sh" "$root/uda" 100 ;;
    *) echo "unknown section $section" >&2; exit 2 ;;
  esac
done
for dir in "$root"/*/; do
  [ -n "$(find "$dir" -name summary.json -print -quit)" ] || continue
  echo "## $(basename "$dir")"
  fedshift report "$dir"
done
