#!/usr/bin/env bash
# Block drafters against EAGLE-3 at equal steps (#59: "in our hands the block drafters lose to EAGLE-3"): every row
# trains online on the reference target from the same self-distilled answers, with the same steps, batch, lr
# schedule and draft vocabulary (the quick recipes' settings with STEPS steps on ANSWERS answers), and is judged by
# `draftsmith eval` (fp32, T=0, no timing runs) on two splits of Spec-Bench in eval's stratified order: the CHOICE
# split (prompts 80..80+LIMIT, where a lever is picked) and the REPORT split (prompts 0..LIMIT, where the picked one
# is reported), each row paired prompt by prompt against the eagle3 row (scripts/bench/levers/levers.py).
#   bash scripts/bench/block_drafters/block_drafters.sh OUT
# Rows (ROWS, default all, in this order):
#   eagle3       smollm2-eagle3-quick (TTT 3) with AdamW (pinned, as every row pins its optimiser)
#   dflash       smollm2-dflash-quick: 2 layers, a block of 4, slot weights 0.8^(i-1) (the recipe's shape as it
#                was measured; the recipe now weighs slots by acceptance, the dflash-acc row, so the row pins decay)
#   dflash-deep  3 layers, a block of 8, slot weights exp(-(i-1)/7) (DFlash's published gamma 7; z-lab/dflash):
#                the peers' shape at this target's size
#   dspark       smollm2-dspark-quick: dflash + the Markov head and the confidence head (heads/dspark/), slot
#                weights 0.8^(i-1) (drafter.dspark.slot_weights: decay, its own section's default)
#   dflash-acc   dflash with drafter.dflash.slot_weights=acceptance (each slot weighted by its share of the
#                block's expected accepted length, heads/losses.py chain_weights) instead of 0.8^(i-1)
#   dspark-acc   dspark with drafter.dspark.slot_weights=acceptance
#   eagle3-acc   eagle3 with drafter.eagle3.step_weights=acceptance (the same weights along its training-time
#                test: heads/eagle/model.py acceptance_weights) instead of 0.8^j
#   eagle3-muon  eagle3 with train.optimizer=muon at the recipe's lr (train/optim.py: Muon on the hidden matrices,
#                AdamW on the rest)
#   eagle3-muon10 eagle3-muon with train.muon_lr = 10 x the recipe's lr (speculators' trainer's default muon_lr,
#                hsc-v0.7.0 src/speculators/train/config/schema.py; RMS-matched to AdamW there as here)
#   eagle3-norms eagle3 with drafter.eagle3.norm_before_fc=true and norm_output=true (EAGLE-3.1's norms as
#                speculators' trainer turns them on for eagle3 by default: one RMSNorm over the fused 3H input,
#                the normed output carried to the next step)
#   eagle3-muon10-nbf eagle3-muon10 with norm_before_fc (the two levers together: paired against eagle3-muon10 too)
#   dflash-acc-muon10 dflash-acc trained with eagle3-muon10's optimiser (Muon at 10 x lr): the block drafter
#                against EAGLE-3 when both take Muon (a folder OUT whose `eagle3` is the eagle3-muon10 row pairs them)
#   dspark-acc-muon10 dspark-acc trained with Muon at 10 x lr (dspark.yaml pins AdamW until this row judges Muon
#                on DSpark: paired against dspark-acc)
#   eagle3-muon10-lk eagle3-muon10 with drafter.loss=lk_hybrid (LK losses' hybrid: KL blended into 1 - acceptance
#                as acceptance grows, heads/losses.py; speculators 0.9.0 losses/eager.py) instead of KL: paired
#                against eagle3-muon10, the recipe's optimiser
#   eagle3-muon10-tvd eagle3-muon10 with drafter.loss=tvd (total variation = 1 - the acceptance rate itself)
#   dflash-acc-muon10-lk, dspark-acc-muon10-lk  the block drafters with Muon and LK losses' hybrid, each paired
#                against the row without it (in the folder of the Muon block rows, /tmp/blockm in the notes)
#   dflash-acc-muon10-dpace dflash-acc-muon10 with D-PACE's slot weights (softened acceptance, / the counted
#                slots: heads/losses.py dpace_weights) instead of the exact ones: paired against dflash-acc-muon10
#   dflash-acc-muon10-ce dflash-acc-muon10 with drafter.loss=ce (the next token of the target's own greedy answer:
#                speculators' DFlash default since its PR #980) instead of KL to its top-64
#   dflash-acc-muon10-l5 dflash-acc-muon10 with 5 draft layers instead of 2, its block of 4 kept (the peers' depth:
#                speculators' and SpecForge's DFlash recipes; dflash-deep changed depth and block together): paired
#                against dflash-acc-muon10 at equal steps (a deeper step costs more: see its train seconds)
#   dflash-acc-muon10-a512 dflash-acc-muon10 with every candidate anchor of a sequence a training block
#                (drafter.dflash.anchors 512 > the 384 positions; the quick recipe samples 64), as the peers train
#   eagle3-muon10-fh eagle3-muon10 with its lm_head frozen at the target's rows (drafter.eagle3.train_lm_head=false,
#                as speculators 0.9.0 keeps it: speculators/model.py), the largest structural difference between our
#                trainer and the peer's; paired against eagle3-muon10
#   eagle3-muon10-group eagle3-muon10 with train.group_by_length=true (micro-batches of about one length: less
#                padding, a cheaper step; train/sources.py group_by_length): does the order cost τ? Its s / step
#                against eagle3-muon10's is a figure only where both trained alone on the cores
#   eagle3-nbf   eagle3 with drafter.eagle3.norm_before_fc=true alone (the EAGLE-3.1 norm llama.cpp b11434 serves
#                too: heads/engines.py RULES["llamacpp-eagle3-norms"])
# Evals: each row's chain of 4 (every kind drafts it) on both splits; the 8-block row also its chain of 8.
# Env: ROWS, STEPS (300), ANSWERS (2000), LIMIT (40), TOKENS (128).
# Resumable: a finished training or eval is skipped; an interrupted training resumes from its checkpoint.
# The EAGLE-3 levers alone (ROWS='eagle3 eagle3-acc eagle3-muon eagle3-muon10 eagle3-norms eagle3-nbf
#   eagle3-muon10-nbf eagle3-muon10-lk eagle3-muon10-tvd') make the eagle3-ablations page:
#   python scripts/bench/results_pages.py --add eagle3-ablations OUT/block-drafters.json
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:?usage: block_drafters.sh OUT}
rows=${ROWS:-eagle3 dflash dflash-deep dspark dflash-acc dspark-acc eagle3-acc eagle3-muon eagle3-muon10 eagle3-norms eagle3-nbf eagle3-muon10-nbf}
steps=${STEPS:-300}
answers=${ANSWERS:-2000}
limit=${LIMIT:-40}
tokens=${TOKENS:-128}
[ -x .venv/bin/python ] || bash scripts/setup_venv.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} HF_HUB_OFFLINE=1
mkdir -p "$out"
# the eagle3 rows pin their optimiser and norms (eagle3.yaml took Muon at 10 x lr for a while, then went back to
# AdamW), so each row keeps the meaning it was measured with: eagle3 is AdamW, each lever one lever on top of it
adamw=(train.optimizer=adamw drafter.eagle3.norm_before_fc=false)
common=("data.limit=$answers" "train.max_steps=$steps" train.select=last train.eval_every=0 "train.save_every=50"
        export.formats=[] log.progress=false)
train() {  # train ROW RECIPE [overrides]
  local row=$1 recipe=$2; shift 2
  [ -f "$out/$row/train_summary.json" ] || .venv/bin/draftsmith train -c "$recipe" --out "$out/$row" "${common[@]}" \
    "$@" >> "$out/$row.log" 2>&1 || { echo "[block] $row: training failed, see $out/$row.log"; exit 1; }
}
evaluate() {  # evaluate ROW TREE: OUT/ROW/eval-{choice,report}-TREE
  local row=$1 tree=$2 split offset
  for split in choice report; do
    offset=$([ "$split" = choice ] && echo 80 || echo 0)
    [ -f "$out/$row/eval-$split-$tree/summary.json" ] || .venv/bin/draftsmith eval --drafter "$out/$row/drafter" \
      --prompts spec-bench --limit "$limit" --max-new-tokens "$tokens" --dtype float32 --tree "$tree" \
      --out "$out/$row/eval-$split-$tree" "eval.offset=$offset" eval.baselines=false drafter.plan=false \
      log.progress=false >> "$out/$row.log" 2>&1 || { echo "[block] $row: eval $split $tree failed, see $out/$row.log"; exit 1; }
  done
}
for row in $rows; do
  echo "[block] $row $(date -u +%H:%M:%S)"
  case $row in
    eagle3)      train eagle3 smollm2-eagle3-quick "${adamw[@]}"
                 evaluate eagle3 chain-4 ;;
    dflash)      train dflash smollm2-dflash-quick train.optimizer=adamw drafter.dflash.slot_weights=decay
                 evaluate dflash chain-4 ;;
    dflash-deep) train dflash-deep smollm2-dflash-quick train.optimizer=adamw drafter.dflash.num_layers=3 drafter.num_speculative_tokens=8 \
                   drafter.head_decay=0.8669 drafter.dflash.slot_weights=decay
                 evaluate dflash-deep chain-4 && evaluate dflash-deep chain-8 ;;
    dspark)      train dspark smollm2-dspark-quick drafter.dspark.slot_weights=decay
                 evaluate dspark chain-4 ;;
    dflash-acc)  train dflash-acc smollm2-dflash-quick train.optimizer=adamw drafter.dflash.slot_weights=acceptance
                 evaluate dflash-acc chain-4 ;;
    dspark-acc)  train dspark-acc smollm2-dspark-quick drafter.dspark.slot_weights=acceptance
                 evaluate dspark-acc chain-4 ;;
    eagle3-acc)  train eagle3-acc smollm2-eagle3-quick "${adamw[@]}" drafter.eagle3.step_weights=acceptance
                 evaluate eagle3-acc chain-4 ;;
    eagle3-muon) train eagle3-muon smollm2-eagle3-quick train.optimizer=muon train.muon_lr=0.0005
                 evaluate eagle3-muon chain-4 ;;
    eagle3-muon10) train eagle3-muon10 smollm2-eagle3-quick train.optimizer=muon train.muon_lr=0.005
                 evaluate eagle3-muon10 chain-4 ;;
    eagle3-norms) train eagle3-norms smollm2-eagle3-quick "${adamw[@]}" drafter.eagle3.norm_before_fc=true \
                   drafter.eagle3.norm_output=true
                 evaluate eagle3-norms chain-4 ;;
    eagle3-muon10-nbf) train eagle3-muon10-nbf smollm2-eagle3-quick train.optimizer=muon train.muon_lr=0.005 \
                   drafter.eagle3.norm_before_fc=true
                 evaluate eagle3-muon10-nbf chain-4 ;;
    dflash-acc-muon10) train dflash-acc-muon10 smollm2-dflash-quick drafter.dflash.slot_weights=acceptance \
                   train.optimizer=muon train.muon_lr=0.005
                 evaluate dflash-acc-muon10 chain-4 ;;
    dspark-acc-muon10) train dspark-acc-muon10 smollm2-dspark-quick drafter.dspark.slot_weights=acceptance \
                   train.optimizer=muon train.muon_lr=0.005
                 evaluate dspark-acc-muon10 chain-4 ;;
    eagle3-muon10-lk) train eagle3-muon10-lk smollm2-eagle3-quick train.optimizer=muon train.muon_lr=0.005 \
                   drafter.loss=lk_hybrid
                 evaluate eagle3-muon10-lk chain-4 ;;
    eagle3-muon10-tvd) train eagle3-muon10-tvd smollm2-eagle3-quick train.optimizer=muon train.muon_lr=0.005 \
                   drafter.loss=tvd
                 evaluate eagle3-muon10-tvd chain-4 ;;
    dflash-acc-muon10-lk) train dflash-acc-muon10-lk smollm2-dflash-quick drafter.dflash.slot_weights=acceptance \
                   train.optimizer=muon train.muon_lr=0.005 drafter.loss=lk_hybrid
                 evaluate dflash-acc-muon10-lk chain-4 ;;
    dspark-acc-muon10-lk) train dspark-acc-muon10-lk smollm2-dspark-quick drafter.dspark.slot_weights=acceptance \
                   train.optimizer=muon train.muon_lr=0.005 drafter.loss=lk_hybrid
                 evaluate dspark-acc-muon10-lk chain-4 ;;
    dflash-acc-muon10-dpace) train dflash-acc-muon10-dpace smollm2-dflash-quick drafter.dflash.slot_weights=dpace \
                   train.optimizer=muon train.muon_lr=0.005
                 evaluate dflash-acc-muon10-dpace chain-4 ;;
    dflash-acc-muon10-ce) train dflash-acc-muon10-ce smollm2-dflash-quick drafter.dflash.slot_weights=acceptance \
                   train.optimizer=muon train.muon_lr=0.005 drafter.loss=ce
                 evaluate dflash-acc-muon10-ce chain-4 ;;
    dflash-acc-muon10-l5) train dflash-acc-muon10-l5 smollm2-dflash-quick drafter.dflash.slot_weights=acceptance \
                   train.optimizer=muon train.muon_lr=0.005 drafter.dflash.num_layers=5
                 evaluate dflash-acc-muon10-l5 chain-4 ;;
    dflash-acc-muon10-a512) train dflash-acc-muon10-a512 smollm2-dflash-quick drafter.dflash.slot_weights=acceptance \
                   train.optimizer=muon train.muon_lr=0.005 drafter.dflash.anchors=512
                 evaluate dflash-acc-muon10-a512 chain-4 ;;
    eagle3-muon10-fh) train eagle3-muon10-fh smollm2-eagle3-quick train.optimizer=muon train.muon_lr=0.005 \
                   drafter.eagle3.train_lm_head=false
                 evaluate eagle3-muon10-fh chain-4 ;;
    eagle3-muon10-group) train eagle3-muon10-group smollm2-eagle3-quick train.optimizer=muon train.muon_lr=0.005 \
                   train.group_by_length=true
                 evaluate eagle3-muon10-group chain-4 ;;
    eagle3-nbf)  train eagle3-nbf smollm2-eagle3-quick "${adamw[@]}" drafter.eagle3.norm_before_fc=true
                 evaluate eagle3-nbf chain-4 ;;
    *)           echo "[block] unknown row $row (rows: eagle3 dflash dflash-deep dspark dflash-acc dspark-acc eagle3-acc eagle3-muon eagle3-muon10 eagle3-norms eagle3-nbf eagle3-muon10-nbf dflash-acc-muon10 dspark-acc-muon10 eagle3-muon10-lk eagle3-muon10-tvd eagle3-muon10-group dflash-acc-muon10-lk dspark-acc-muon10-lk dflash-acc-muon10-dpace dflash-acc-muon10-ce dflash-acc-muon10-l5 dflash-acc-muon10-a512 eagle3-muon10-fh)"; exit 1 ;;
  esac
done
.venv/bin/python scripts/bench/block_drafters/block_drafters.py "$out" \
  --command "ROWS='$rows' STEPS=$steps ANSWERS=$answers LIMIT=$limit TOKENS=$tokens bash scripts/bench/block_drafters/block_drafters.sh $out"
