#!/usr/bin/env bash
# The 3-seed result tables of the method issues, each next to its baselines in the same
# setting. Resumable (each sweep skips finished runs and resumes interrupted ones).
#   bash benchmarks/results/method_tables.sh [OUT_ROOT] [SECTION...]
# Sections: label-skew, per-domain, lodo, lodo-official, segmentation, perada, personalized,
# uda.
# Every run uses one torch thread (results are bit-identical only for the same thread
# count), so two sweeps can share a 2-core machine: start the same command twice side by
# side and each skips the runs the other is writing. CPU cost per run, measured with two runs
# side by side: label-skew 1.5-4 min; per-domain 2-3.5 min; lodo 30 rounds: fedga 4 min,
# fedavg/fedsr/ditto/local 4-7 min, fedadg 9-11 min, ccst 9-12 min, feddg-elcfs 14-17 min;
# perada 6 min (fedavg from its backbone 2.5 min); segmentation, 10 rounds of the unet:
# fedavg 3 min, feddg-elcfs 11 min. TARGETS (default mnistm) and SEEDS (default 0,1,2) override the
# lodo/segmentation columns. DEVICE=cuda runs on a GPU (default auto: the GPU when there is
# one); on one H100 with 13 copies of this script side by side, a lodo run took 0.6-4.6 min
# (fedga fastest, ccst slowest) and the 96 lodo runs of 4 targets plus the perada and
# personalized sections took 18 minutes together.
set -euo pipefail
root=${1:-runs/tables}; shift || true
sections=${*:-label-skew per-domain lodo lodo-official segmentation perada personalized uda}
seeds=${SEEDS:-0,1,2}
targets=${TARGETS:-mnistm}
one=(--set threads=1 --set device="${DEVICE:-auto}")
skew=(--protocol personalized -d digits-dg:mnist --set partition=nway-kshot
      --set clients_per_domain=20 --set ways=3 --set shots=15 --set stdev=2
      --set model=fedproto-cnn --set batch_size=8 --set local_epochs=2 "${one[@]}")
per_domain=(--protocol per-domain --rounds 30 --set clients_per_domain=5
            --set client_data_fraction=0.3 "${one[@]}")

syn_backbone() {  # the public pretraining step PerAda starts from (syn, 10 epochs)
  mkdir -p "$root/backbones"
  [ -f "$root/backbones/cnn-syn.pt" ] || \
    fedshift pretrain --domain syn --out "$root/backbones/cnn-syn.pt" --epochs 10
}

for section in $sections; do
  case $section in
    label-skew)  # FedProto / BD-FedProto / MOON vs FedAvg and local, N-way K-shot (issue 3)
      fedshift sweep -a fedproto,bd-fedproto,moon,fedavg,local -t clients --seeds $seeds \
        --rounds 50 "${skew[@]}" --out "$root/label-skew" --quiet
      fedshift sweep -a fedproto,local -t clients --seeds $seeds --rounds 50 "${skew[@]}" \
        --set hetero_models=fedproto --out "$root/label-skew-hetero" --quiet ;;
    per-domain)  # FPL vs FedAvg and local, every domain trains and is tested (issue 3)
      fedshift sweep -a fpl,fedavg -t all --seeds $seeds "${per_domain[@]}" \
        --out "$root/per-domain" --quiet
      # 20 personal models x 4 test domains per evaluation: evaluated every 10th round
      fedshift sweep -a local -t all --seeds $seeds "${per_domain[@]}" --set eval_every=10 \
        --out "$root/per-domain" --quiet
      # the paper's UPCR form (sum over dimensions) as an ablation
      fedshift sweep -a fpl -t all --seeds $seeds "${per_domain[@]}" \
        --set algo.upcr_reduction=sum --out "$root/per-domain-upcr-sum" --quiet ;;
    lodo)  # leave-one-domain-out methods vs FedAvg (issues 3 and 6), cheapest first
      fedshift sweep -a fedavg,local,fedsr -t $targets --seeds $seeds --rounds 30 "${one[@]}" \
        --out "$root/lodo" --quiet
      fedshift sweep -a fedga,ditto,feddg-elcfs,fedadg,ccst -t $targets --seeds $seeds \
        --rounds 30 "${one[@]}" --out "$root/lodo" --quiet ;;
    lodo-official)  # FedGA and FedADG as their official code runs them (issue 6 ablation)
      fedshift sweep -a fedga -t $targets --seeds $seeds --rounds 30 "${one[@]}" \
        --set algo.variant=official --set algo.gap_metric=accuracy \
        --out "$root/lodo-fedga-official" --quiet
      fedshift sweep -a fedadg -t $targets --seeds $seeds --rounds 30 "${one[@]}" \
        --set algo.variant=official --set algo.label_value=0.7 \
        --set algo.share_discriminator=false --out "$root/lodo-fedadg-official" --quiet ;;
    segmentation)  # FedDG-ELCFS vs FedAvg on digit-foreground segmentation, Dice (issue 6)
      fedshift sweep -a fedavg,feddg-elcfs -t $targets --seeds $seeds --rounds "${SEG_ROUNDS:-10}" \
        --set problem=segmentation --set model=unet "${one[@]}" --out "$root/segmentation" --quiet ;;
    perada)  # PerAda on a backbone pretrained on syn, which then stays out of the federation
      syn_backbone
      for t in mnist mnistm optdigits; do
        s=$(echo mnist,mnistm,optdigits | tr , '\n' | grep -vx "$t" | paste -sd,)
        perada=(-a perada -t "$t" --seeds $seeds --rounds 30 --set sources="$s"
                --set server_data=syn --set algo.backbone="$root/backbones/cnn-syn.pt" "${one[@]}")
        fedshift sweep "${perada[@]}" --out "$root/perada" --quiet
        # ablation: the last KD step, unvalidated
        fedshift sweep "${perada[@]}" --set algo.kd_selection=last --out "$root/perada-kd-last" \
          --quiet
        fedshift sweep -a fedavg -t "$t" --seeds $seeds --rounds 30 --set sources="$s" \
          --set model_weights="$root/backbones/cnn-syn.pt" "${one[@]}" \
          --out "$root/perada-fedavg" --quiet
      done ;;
    personalized)  # Ditto / PerAda personalized accuracy vs FedAvg and local
      personal=(--protocol personalized -t clients --seeds $seeds --rounds 30
                --set sources=mnist,mnistm,optdigits --set clients_per_domain=2
                --set partition=dirichlet "${one[@]}" --quiet)
      fedshift sweep -a fedavg,ditto,local "${personal[@]}" --out "$root/personalized"
      syn_backbone
      bb=(--set server_data=syn --set algo.backbone="$root/backbones/cnn-syn.pt")
      fedshift sweep -a perada "${personal[@]}" "${bb[@]}" --out "$root/personalized"
      # ablations: the last KD step unvalidated, and no distillation (plain averaging)
      fedshift sweep -a perada "${personal[@]}" "${bb[@]}" --set algo.kd_selection=last \
        --out "$root/personalized-kd-last"
      fedshift sweep -a perada "${personal[@]}" "${bb[@]}" --set algo.distill=false \
        --out "$root/personalized-nokd" ;;
    uda)  # FACT / FACT-NF / FADA vs source-only references (issue 5)
      bash "$(dirname "$0")/uda_table.sh" "$root/uda" ;;
    *) echo "unknown section $section" >&2; exit 2 ;;
  esac
done
for dir in "$root"/*/; do
  [ -n "$(find "$dir" -name summary.json -print -quit)" ] || continue
  echo "## $(basename "$dir")"
  fedshift report "$dir"
done
