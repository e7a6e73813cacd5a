#!/usr/bin/env bash
# Levers at equal data (issues: "go ahead of speculators at equal CPU-hours", "parallel drafters against EAGLE-3 at
# equal training budget"): rows trained from ONE set of offline features -- the ones scripts/bench/speculators_peer/speculators_peer.sh
# extracted (PEER/ours/features: the EAGLE-3 recipe's first 2,000 answers, layers 2/15/27, top-64 logits) -- and
# judged on the same Spec-Bench prompts, each against the EAGLE-3 baseline row paired prompt by prompt.
#   bash scripts/bench/levers/levers.sh OUT PEER        (PEER: a finished speculators_peer.sh output folder)
# Rows (ROWS, default all, in this order):
#   eagle3   the baseline: PEER/ours (300 steps, TTT 3), linked, not retrained; its evals linked too
#   wall     PEER/ours-wall (the steps the peer's training seconds buy: ~1.1 epochs), linked
#   dflash   kind dflash (block of 4), same features, steps, lr schedule and draft vocabulary
#   peagle   kind peagle (block of 4), likewise
#   lookup   drafter.lookup_weight=LOOKUP_WEIGHT (0.3): positions prompt lookup over the sequence's own prefix already
#            predicts weigh less in the loss (heads/eagle/model.py)
#   ttt1     EAGLE-3 with drafter.eagle3.ttt_steps=1 (no training-time test)
#   epochsN  N epochs over the features (N x the steps of one epoch, its own cosine schedule): epochs2 by default
#   ttt5     ttt_steps=5
#   tttN-wall  ttt_steps=N for the baseline's training seconds (as many steps as they buy at the tttN row's measured
#            seconds per step; needs that row): a cheaper step at equal CPU time
# Evals of every row (bf16 = dtype auto, T=0, no timing baseline): EAGLE rows the recipe's 16-node dynamic tree and a
# chain of 5; eagle3, dflash and peagle also a chain of 4 in fp32 (the block drafters' block; tokens/s; eagle3's with
# the plain-decoding baseline); eagle3 and lookup also the 16-node tree plus a prompt-lookup branch of 5 (what a
# lookup-aware drafter is for); dflash and peagle served by vLLM (chain ENGINE_CHAIN, fp32, first ENGINE_LIMIT
# prompts; PEER/engine-ours is eagle3's) -> OUT/levers.json (scripts/bench/levers/levers.py).
# The choice split: the rows named in CHOICE (default none) are also judged on Spec-Bench's prompts CHOICE_OFFSET..
# (80, past the 80 the recipes report on) x CHOICE_LIMIT (80) in eval's stratified order, both trees, the baseline too
# (eval-choice-dynamic-16, eval-choice-chain-5), paired against the baseline there: a lever the recipe adopts must
# beat the paired noise on prompts it was not picked on.
# Env: ROWS, LIMIT (40, as PEER's evals), TOKENS (128), LOOKUP_WEIGHT (0.3), ENGINE_CHAIN (3), ENGINE_LIMIT (20),
# CHOICE, CHOICE_OFFSET, CHOICE_LIMIT.
# Resumable: every finished training and eval is skipped; an interrupted training resumes from its checkpoint.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:?usage: levers.sh OUT PEER}
peer=${2:?usage: levers.sh OUT PEER (a finished scripts/bench/speculators_peer/speculators_peer.sh output folder)}
rows=${ROWS:-eagle3 wall dflash peagle lookup ttt1 epochs2 ttt1-wall ttt5}
limit=${LIMIT:-40}
tokens=${TOKENS:-128}
lookup_weight=${LOOKUP_WEIGHT:-0.3}
engine_chain=${ENGINE_CHAIN:-3}
engine_limit=${ENGINE_LIMIT:-20}
choice=${CHOICE:-}
choice_offset=${CHOICE_OFFSET:-80}
choice_limit=${CHOICE_LIMIT:-80}
[ -x .venv/bin/python ] || bash scripts/setup_venv.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} HF_HUB_OFFLINE=1
features="$peer/ours/features"
[ -f "$features/train/index.json" ] && [ -f "$peer/ours/train_summary.json" ] \
  || { echo "[levers] $peer is not a finished speculators_peer.sh output (no ours/features, ours/train_summary.json)"; exit 1; }
mkdir -p "$out"
# the baseline's settings, read back from its own record: answers, steps, lr
read -r answers steps lr epoch_steps < <(.venv/bin/python scripts/bench/levers/readback.py baseline "$peer")
common=("data.limit=$answers" extract.enabled=true "extract.layers=[29]" "extract.out=$features" train.select=last
        "train.lr=$lr" export.formats=[] log.progress=false)
link() {  # link ROW to a finished run of PEER and its evals (the two trees)
  local row=$1 run=$2 evals=$3
  mkdir -p "$out/$row"
  for f in config.resolved.yaml train_summary.json metrics.jsonl data.json drafter; do
    [ -e "$out/$row/$f" ] || ln -s "$(realpath "$peer/$run/$f")" "$out/$row/$f"
  done
  for tree in dynamic-16 chain-5; do
    [ -e "$out/$row/eval-$tree" ] || ln -s "$(realpath "$peer/eval-$evals-$tree")" "$out/$row/eval-$tree"
  done
}
train() {  # train ROW with RECIPE and overrides (offline, from the shared features)
  local row=$1 recipe=$2; shift 2
  [ -f "$out/$row/train_summary.json" ] || .venv/bin/draftsmith train -c "$recipe" --out "$out/$row" "${common[@]}" \
    "$@" > "$out/$row.log" 2>&1 || { echo "[levers] $row: training failed, see $out/$row.log"; exit 1; }
}
evaluate() {  # evaluate ROW NAME TREE DTYPE [overrides]: OUT/ROW/eval-NAME (EVAL_LIMIT: prompts, default LIMIT)
  local row=$1 name=$2 tree=$3 dtype=$4; shift 4
  [ -f "$out/$row/eval-$name/summary.json" ] || .venv/bin/draftsmith eval --drafter "$out/$row/drafter" \
    --prompts spec-bench --limit "${EVAL_LIMIT:-$limit}" --max-new-tokens "$tokens" --dtype "$dtype" --tree "$tree" \
    --out "$out/$row/eval-$name" drafter.plan=false log.progress=false "$@" >> "$out/$row.log" 2>&1 \
    || { echo "[levers] $row: eval $name failed, see $out/$row.log"; exit 1; }
}
serve() {  # ROW served by vLLM beside our decoder
  local row=$1
  if [ "$engine_limit" -gt 0 ] && [ ! -f "$out/$row/engine/summary.json" ]; then
    .venv/bin/draftsmith eval --engine vllm --drafter "$out/$row/drafter" --prompts spec-bench --limit "$engine_limit" \
      --max-new-tokens "$tokens" --dtype float32 --tree "chain-$engine_chain" --out "$out/$row/engine" \
      log.progress=false >> "$out/$row.log" 2>&1 || { echo "[levers] $row: engine eval failed, see $out/$row.log"; exit 1; }
  fi
}
eagle_evals() {
  evaluate "$1" dynamic-16 dynamic-16 auto eval.baselines=false
  evaluate "$1" chain-5 chain-5 auto eval.baselines=false
}
for row in $rows; do
  echo "[levers] $row $(date -u +%H:%M:%S)"
  case $row in
    eagle3) link eagle3 ours ours
            evaluate eagle3 chain-4-fp32 chain-4 float32 eval.baselines=true
            evaluate eagle3 dynamic-16-lookup dynamic-16 auto eval.baselines=false drafter.lookup_branch=5
            [ -e "$out/eagle3/engine" ] || [ ! -f "$peer/engine-ours/summary.json" ] \
              || ln -s "$(realpath "$peer/engine-ours")" "$out/eagle3/engine" ;;
    wall)   [ -f "$peer/ours-wall/train_summary.json" ] && link wall ours-wall ours-wall \
              || echo "[levers] wall: $peer has no ours-wall (speculators_peer.sh WALL=1): skipped" ;;
    dflash|peagle)
            train "$row" "smollm2-$row" "data.limit=$answers" "train.max_steps=$steps" "train.eval_every=$steps"
            evaluate "$row" chain-4-fp32 chain-4 float32 eval.baselines=false
            serve "$row" ;;
    ttt[1-9]-wall)
            n=${row%-wall} && n=${n#ttt}
            [ -f "$out/ttt$n/train_summary.json" ] || { echo "[levers] $row needs the ttt$n row first"; exit 1; }
            wall_steps=$(.venv/bin/python scripts/bench/levers/readback.py wall-steps "$peer/ours" "$out/ttt$n")
            train "$row" smollm2-eagle3 "train.max_steps=$wall_steps" "train.eval_every=$wall_steps" \
              "drafter.eagle3.ttt_steps=$n"
            eagle_evals "$row" ;;
    ttt[1-9])
            train "$row" smollm2-eagle3 "train.max_steps=$steps" "train.eval_every=$steps" \
              "drafter.eagle3.ttt_steps=${row#ttt}"
            eagle_evals "$row" ;;
    lookup) train lookup smollm2-eagle3 "train.max_steps=$steps" "train.eval_every=$steps" \
              "drafter.lookup_weight=$lookup_weight"
            eagle_evals lookup
            evaluate lookup dynamic-16-lookup dynamic-16 auto eval.baselines=false drafter.lookup_branch=5 ;;
    epochs[1-9]*)
            n=${row#epochs}
            train "$row" smollm2-eagle3 "train.max_steps=$((n * epoch_steps))" "train.eval_every=$((n * epoch_steps))"
            eagle_evals "$row" ;;
    *)      echo "[levers] unknown row $row (rows: eagle3 wall dflash peagle lookup tttN tttN-wall epochsN)"; exit 1 ;;
  esac
done
[ -z "$choice" ] || choice="eagle3 ${choice//eagle3/}"  # the baseline first: every other row is paired against it
for row in $choice; do  # the choice split (after every row trained): prompts the levers were not compared on
  [ -e "$out/$row/drafter" ] || { echo "[levers] CHOICE names $row, which has no drafter under $out"; exit 1; }
  echo "[levers] choice split: $row $(date -u +%H:%M:%S)"
  for tree in dynamic-16 chain-5; do
    EVAL_LIMIT=$choice_limit evaluate "$row" "choice-$tree" "$tree" auto eval.baselines=false "eval.offset=$choice_offset"
  done
done
.venv/bin/python scripts/bench/levers/levers.py "$out" \
  --command "ROWS='$rows' LIMIT=$limit TOKENS=$tokens LOOKUP_WEIGHT=$lookup_weight ENGINE_CHAIN=$engine_chain ENGINE_LIMIT=$engine_limit${choice:+ CHOICE='$choice' CHOICE_OFFSET=$choice_offset CHOICE_LIMIT=$choice_limit} bash scripts/bench/levers/levers.sh $out $peer"
