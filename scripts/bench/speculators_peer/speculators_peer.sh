#!/usr/bin/env bash
# A peer at equal budget (issue: "the row every 'our tau is lower than the paper' thread asks for"): vLLM's
# speculators 0.9.0 trains its own EAGLE-3 drafter from the same features draftsmith trains its drafter from,
# and both are judged in our decoder on the same prompts and trees.
#   bash scripts/bench/speculators_peer/speculators_peer.sh OUT        (SPEC_VENV: the speculators venv, default .engine-venv)
# 1. draftsmith extract: the EAGLE-3 recipe's first ANSWERS answers -> shards with the three fused layers, the raw
#    last layer (what speculators recomputes its teacher from) and top-64 logits (what ours trains on)
# 2. scripts/bench/speculators_peer/speculators_peer.py convert: the shards in speculators' offline layout, with the draft vocabulary
#    draftsmith builds from the same train split (checked against ours's drafter after step 4: same-vocab)
# 3. speculators' trainer (one CPU process, scripts/bench/speculators_peer/speculators_peer.py train) for STEPS steps of
#    --total-seq-len tokens packed, the smallest that packs its epoch into as many steps as ours's batches of 4 make
#    (speculators_peer.py seq-len: equal tokens per step on average) -> OUT/peer/drafter (its weights and config);
#    resumable: it saves every CKPT_FREQ of the epoch (fp32) and a rerun continues from there; its seconds are the
#    sum of its sittings (OUT/peer/train_seconds.sittings)
# 4. draftsmith train on those shards (offline) for STEPS steps -> OUT/ours/drafter (resumable: its own checkpoints)
# 5. draftsmith eval of both (bf16, T=0, no timing) with the recipe's 16-node dynamic tree and a chain of 5
# 6. both served by vLLM (`draftsmith eval --engine vllm`, fp32, a chain of ENGINE_CHAIN, batch 1) beside our decoder
#    on the first ENGINE_LIMIT prompts of every set in PROMPT_SETS: served alpha per position, greedy equality,
#    vLLM's speedup
#    -> OUT/peer.json (tau, acceptance by depth, training seconds of each; ours's validation at its last step:
#    expected tau of a chain of 5 from the joint counters and from the marginal accuracies, beside the measured one;
#    and the same estimate for both on the chain-5 eval's own answers, scripts/bench/speculators_peer/validate_outputs.py)
# 7. ours again at equal wall-clock (WALL=1, the default): as many steps as the peer's training seconds buy at ours's
#    measured seconds per step, on the same features -> OUT/ours-wall, judged with both trees
# Env: STEPS (default 300), ANSWERS (default 2000), LIMIT (prompts, default 40), TOKENS (default 128), LR (5e-4),
#      ENGINE_CHAIN (3), ENGINE_LIMIT (20; 0 skips the engine), WALL (1: step 7), DRAFT_VOCAB (16384, smollm2-eagle3's
#      drafter.eagle3.draft_vocab), CKPT_FREQ (0.05 of an epoch between the peer's checkpoints), and for the full head-to-head
#      PROMPT_SETS (default "spec-bench"; e.g. "spec-bench mt-bench") and TREES (default "dynamic-16 chain-5", which it
#      must hold; e.g. "dynamic-16 chain-1 chain-2 chain-3 chain-4 chain-5"): step 5 judges both drafters on every set
#      and tree (a set other than spec-bench in eval-WHO-SET-TREE), paired per set and tree on the page.
#   stage 2 of #40 (all answers, one epoch, Spec-Bench 80 + MT-bench 80, chains 1-5):
#      ANSWERS=100000 STEPS=3167 LIMIT=80 WALL=0 PROMPT_SETS="spec-bench mt-bench" \
#      TREES="dynamic-16 chain-1 chain-2 chain-3 chain-4 chain-5" bash scripts/bench/speculators_peer/speculators_peer.sh OUT
# Optimiser: OPTIMIZER (adamw, the committed EAGLE-3 figures; muon: MUON_LR, 5e-3, on both trainers' draft matrices,
#   lr on the rest, no weight decay in either group) is pinned on both sides: ours train.optimizer (eagle3.yaml and
#   dflash.yaml default to AdamW), the peer --optimizer.
# ARM=dflash FROM=OUT_EAGLE3: DFlash instead, in its own OUT, on an EAGLE-3 arm run's features (same ANSWERS): the
#   peer's data with draftsmith's own loss mask (speculators_peer.py convert --mask plain --hs-from FROM/peer: hidden
#   states and vocabulary symlinked, no second copy) and FROM's --total-seq-len; speculators --speculator-type dflash
#   (2 Qwen3 layers, full attention, a non-causal block of 5 counting the anchor = 4 drafted slots, mask id 49151,
#   at most MAX_ANCHORS=512 blocks a packed row, loss PEER_LOSS=ce weighted PEER_WEIGHT=dpace: its own recipe) against
#   `draftsmith train -c smollm2-dflash` (at most 128 blocks a sequence x 4 sequences a step) at equal steps; OPTIMIZER
#   defaults to adamw too; TREES default "chain-4 chain-3" (must hold chain-4, the trained block), ENGINE_CHAIN
#   <= 4, no validate_outputs.py (EAGLE-only); OUT/peer/anchors.json: blocks per step of each (speculators_peer.py
#   anchors).
# Resumable: each finished step is skipped. Disk: two copies of the features (~4.6 KB per token each, bf16).
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:?usage: speculators_peer.sh OUT}
arm=${ARM:-eagle3}
steps=${STEPS:-300}
answers=${ANSWERS:-2000}
limit=${LIMIT:-40}
tokens=${TOKENS:-128}
lr=${LR:-5.0e-4}
draft_vocab=${DRAFT_VOCAB:-16384}
ckpt_freq=${CKPT_FREQ:-0.05}
engine_chain=${ENGINE_CHAIN:-3}
engine_limit=${ENGINE_LIMIT:-20}
venv=${SPEC_VENV:-.engine-venv}
prompt_sets=${PROMPT_SETS:-spec-bench}
muon_lr=${MUON_LR:-5e-3}
max_anchors=${MAX_ANCHORS:-512}
case $arm in  # the page's columns: what TREES must hold
  eagle3) columns="dynamic-16 chain-5" optimizer=${OPTIMIZER:-adamw} recipe=smollm2-eagle3 from=;;
  dflash) columns="chain-4 chain-3" optimizer=${OPTIMIZER:-adamw} recipe=smollm2-dflash from=${FROM:-}
    if [ "$engine_chain" -gt 4 ]; then echo "speculators_peer.sh: ENGINE_CHAIN $engine_chain > 4, DFlash's block" >&2; exit 2; fi
    if [ ! -f "$from/ours/features/train/index.json" ] || [ ! -f "$from/peer/peer.json" ]; then
      echo "speculators_peer.sh: ARM=dflash needs FROM, an EAGLE-3 arm's OUT with ours/features and peer/ (got '$from')" >&2; exit 2; fi;;
  *) echo "speculators_peer.sh: ARM must be eagle3 or dflash; got '$arm'" >&2; exit 2;;
esac
case $optimizer in adamw|muon) ;; *) echo "speculators_peer.sh: OPTIMIZER must be adamw or muon; got '$optimizer'" >&2; exit 2;; esac
trees=${TREES:-$columns}
must=$([ "$arm" = eagle3 ] && echo "$columns" || echo chain-4)
for tree in $must; do
  case " $trees " in *" $tree "*) ;;
    *) echo "speculators_peer.sh: TREES must hold ${must// / and } (the page's columns); got '$trees'" >&2; exit 2;; esac
done
page_columns=$(for tree in $columns; do case " $trees " in *" $tree "*) printf '%s ' "$tree";; esac; done)
[ -x "$venv/bin/speculators" ] || bash scripts/dev/engine_venv.sh "$venv"
[ -x .venv/bin/python ] || bash scripts/setup_venv.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} HF_HUB_OFFLINE=1
mkdir -p "$out"
ours="$out/ours" peer="$out/peer"
# validation once, at the last step (train.select=last keeps that drafter): the estimate beside the measured tau.
# data.validation=[]: a 1 % held-out split of the answers (the shipped recipe now validates on regenerated Spec-Bench
# answers, which only its pipeline makes)
common=("data.limit=$answers" "data.validation=[]" extract.enabled=true "extract.layers=[29]" "train.max_steps=$steps"
        train.select=last "train.eval_every=$steps" "train.lr=$lr" export.formats=[] log.progress=false
        "train.optimizer=$optimizer")
peer_opt=(--optimizer "$optimizer" --lr "$lr")
if [ "$optimizer" = muon ]; then  # speculators' Muon group decays at 0.1 by default; ours at train.weight_decay 0
  common+=("train.muon_lr=$muon_lr") peer_opt+=(--muon-lr "$muon_lr" --muon-weight-decay 0.0)
fi
target="${DRAFTSMITH_HOME:-$HOME/.cache/draftsmith}/targets/smollm2-135m-instruct"
if [ "$arm" = eagle3 ]; then
  feats="$ours/features" ours_arm=()
  peer_arm=(--num-layers 1 --draft-arch llama --full-attention-indices 0 --no-norm-before-residual --no-norm-before-fc
            --no-norm-output --loss-fn kl_div --mask-token-id 0 --ttt-steps 3 --ttt-step-loss-decay 0.8)
  [ -f "$feats/train/index.json" ] || .venv/bin/draftsmith extract -c "$recipe" --out "$ours" "${common[@]}"
  [ -f "$peer/peer.json" ] || .venv/bin/python scripts/bench/speculators_peer/speculators_peer.py convert "$feats" "$target" "$peer" \
    --draft-vocab "$draft_vocab"
else  # FROM's features (1 epoch: STEPS binds, not the recipe's 0.7 epoch or 100 minutes), FROM's hidden states
  feats="$from/ours/features"
  ours_arm=("extract.out=$feats" train.epochs=1 train.max_minutes=null drafter.dflash.anchors=128)
  peer_arm=(--num-layers 2 --draft-arch qwen3 --full-attention-indices 0 1 --sliding-window-non-causal --block-size 5
            --no-sample-from-anchor --max-anchors "$max_anchors" --mask-token-id 49151 --loss-fn "${PEER_LOSS:-ce}"
            --per-position-loss-weight "${PEER_WEIGHT:-dpace}")
  [ -f "$peer/peer.json" ] || .venv/bin/python scripts/bench/speculators_peer/speculators_peer.py convert "$feats" "$target" "$peer" \
    --draft-vocab "$draft_vocab" --mask plain --hs-from "$from/peer"
  if [ ! -s "$peer/seq_len" ] && [ -s "$from/peer/seq_len" ]; then cp "$from/peer/seq_len" "$peer/"; fi
fi
if [ ! -f "$peer/train_seconds" ]; then
  ratio=$(.venv/bin/python scripts/bench/speculators_peer/speculators_peer.py ratio "$peer")
  [ -s "$peer/seq_len" ] || "$venv/bin/python" scripts/bench/speculators_peer/speculators_peer.py seq-len "$peer" 4 > "$peer/seq_len"
  read -r seqlen _ < "$peer/seq_len"
  if [ "$arm" = dflash ] && [ ! -s "$peer/anchors.json" ]; then  # blocks per step: speculators' per row, ours's per sequence
    "$venv/bin/python" scripts/bench/speculators_peer/speculators_peer.py anchors "$peer" 4 128 5 "$max_anchors" > "$peer/anchors.json"
  fi
  sittings="$peer/train_seconds.sittings"
  if [ -f "$peer/sitting.start" ]; then  # a sitting killed before it could record its seconds: until its log's last line
    echo $(( $(stat -c %Y "$peer/train.log") - $(cat "$peer/sitting.start") )) >> "$sittings"
  fi
  date +%s > "$peer/sitting.start"
  # a rerun resumes from $peer/ckpt/0 (mid-epoch: training_state.json); speculators_peer.py train loads it onto the CPU
  "$venv/bin/python" scripts/bench/speculators_peer/speculators_peer.py train --speculator-type "$arm" \
    --verifier-name-or-path "$target" \
    --data-path "$peer/data" --hidden-states-path "$peer/hs" --on-missing raise --train-data-ratio "$ratio" \
    --target-layer-ids 2 15 27 --d2t-path "$peer/d2t.npy" --t2d-path "$peer/t2d.npy" "${peer_arm[@]}" \
    --draft-attn-impl sdpa --loss-implementation eager --hidden-states-dtype float32 --num-workers 0 "${peer_opt[@]}" \
    --weight-decay 0.0 --scheduler-type cosine --scheduler-warmup-steps 60 --total-seq-len "$seqlen" \
    --epochs 1 --max-steps "$steps" --checkpoint-freq "$ckpt_freq" --save-path "$peer/ckpt" --log-dir "$peer/logs" \
    --seed 0 >> "$peer/train.log" 2>&1 && ok=1 || ok=0
  echo $(( $(date +%s) - $(cat "$peer/sitting.start") )) >> "$sittings" && rm "$peer/sitting.start"
  # a SIGINT/SIGTERM'd trainer saves ckpt/interrupted and exits 0: finished = its end-of-training save exists
  [ "$ok" = 1 ] && .venv/bin/python scripts/bench/speculators_peer/speculators_peer.py finished "$peer" \
    || { echo "[peer] speculators training stopped: see $peer/train.log (a rerun resumes)"; exit 1; }
  awk '{ s += $1 } END { print s }' "$sittings" > "$peer/train_seconds"
  # the drafter itself (tables name it by its folder's parent: "peer"); the pickled optimizer state stays behind
  mkdir -p "$peer/drafter" && cp "$peer/ckpt/0/config.json" "$peer/ckpt/0/model.safetensors" "$peer/drafter/"
fi
[ -f "$ours/train_summary.json" ] || .venv/bin/draftsmith train -c "$recipe" --out "$ours" "${common[@]}" "${ours_arm[@]}"
.venv/bin/python scripts/bench/speculators_peer/speculators_peer.py same-vocab "$ours/drafter" "$peer"
for who in ours peer; do
  drafter=$([ "$who" = ours ] && echo "$ours/drafter" || echo "$peer/drafter")
  for pset in $prompt_sets; do
    for tree in $trees; do
      name=$([ "$pset" = spec-bench ] && echo "eval-$who-$tree" || echo "eval-$who-$pset-$tree")
      [ -f "$out/$name/summary.json" ] || .venv/bin/draftsmith eval --drafter "$drafter" --prompts "$pset" \
        --limit "$limit" --max-new-tokens "$tokens" --dtype "${DTYPE:-auto}" --tree "$tree" --out "$out/$name" \
        eval.baselines=false drafter.plan=false log.progress=false
    done
  done
  # the training-time estimate on the decoder's own T=0 answers (scripts/bench/speculators_peer/validate_outputs.py): data or roots?
  [ "$arm" != eagle3 ] || [ -f "$out/validate-$who.json" ] || .venv/bin/python scripts/bench/speculators_peer/validate_outputs.py \
    "$drafter" "$out/eval-$who-chain-5" --out "$out/validate-$who.json"
  for pset in $prompt_sets; do  # served by vLLM on the first ENGINE_LIMIT prompts of every set
    name=$([ "$pset" = spec-bench ] && echo "engine-$who" || echo "engine-$who-$pset")
    if [ "$engine_limit" -gt 0 ] && [ ! -f "$out/$name/summary.json" ]; then
      .venv/bin/draftsmith eval --engine vllm --drafter "$drafter" --prompts "$pset" --limit "$engine_limit" \
        --max-new-tokens "$tokens" --dtype float32 --tree "chain-$engine_chain" --out "$out/$name" log.progress=false
    fi
  done
done
if [ "${WALL:-1}" = 1 ]; then  # ours at the peer's training seconds (its own cosine schedule over those steps)
  wall_steps=$(.venv/bin/python scripts/bench/speculators_peer/collect.py wall-steps "$out")
  [ -f "$out/ours-wall/train_summary.json" ] || .venv/bin/draftsmith train -c "$recipe" --out "$out/ours-wall" \
    "${common[@]}" "${ours_arm[@]}" "train.max_steps=$wall_steps" "train.eval_every=$wall_steps" "extract.out=$feats"
  for tree in $page_columns; do
    [ -f "$out/eval-ours-wall-$tree/summary.json" ] || .venv/bin/draftsmith eval --drafter "$out/ours-wall/drafter" \
      --prompts spec-bench --limit "$limit" --max-new-tokens "$tokens" --dtype "${DTYPE:-auto}" --tree "$tree" \
      --out "$out/eval-ours-wall-$tree" eval.baselines=false drafter.plan=false log.progress=false
  done
fi
arm_env=$([ "$arm" = eagle3 ] || echo "ARM=$arm FROM=$from MAX_ANCHORS=$max_anchors PEER_LOSS=${PEER_LOSS:-ce} PEER_WEIGHT=${PEER_WEIGHT:-dpace} ")
opt_env="OPTIMIZER=$optimizer$([ "$optimizer" = adamw ] || echo " MUON_LR=$muon_lr")"
.venv/bin/python scripts/bench/speculators_peer/collect.py peer-json "$out" "$steps" "${arm_env}STEPS=$steps ANSWERS=$answers LIMIT=$limit TOKENS=$tokens LR=$lr $opt_env ENGINE_CHAIN=$engine_chain ENGINE_LIMIT=$engine_limit WALL=${WALL:-1} PROMPT_SETS='$prompt_sets' TREES='$trees' bash scripts/bench/speculators_peer/speculators_peer.sh $out" "$prompt_sets" "$trees" --arm "$arm" --columns "$page_columns"
