#!/usr/bin/env bash
# The general-chat drafter table (#59 "the first general-chat drafter table below 200M"): a finished recipe run
# (`draftsmith pipeline -c RECIPE --out RUN`, e.g. scripts/bench/full_recipes/recipe_epochs.sh RUN) judged on
# Spec-Bench (by category) and MT-bench, a chain and the recipe's tree, at T=0 and T=0.7, and served by vLLM and
# llama.cpp beside our decoder; then chat_table.py collects every run named into one JSON for the page.
#   bash scripts/bench/chat_table/chat_table.sh RECIPE RUN [RECIPE RUN ...]     -> RUN/chat-*/ per run
#   python scripts/bench/chat_table/chat_table.py OUT.json RECIPE=RUN ...        (the last line of this script)
# Per run (each step skipped once its summary exists; a stopped eval continues where it stopped):
#   chat-{sb,mt}-chain-K, chat-{sb,mt}-tree    Spec-Bench / MT-bench LIMIT prompts from 0 x TOKENS, T=0, the eval
#                                              dtype of the recipe (bf16 where native), chain of K and TREE
#   chat-{sb,mt}-chain-K-t07                   the same chain at T=0.7 (our rule: drafts sampled from q)
#   chat-vllm, chat-llamacpp                   served: `draftsmith eval --engine vllm|llamacpp`, float32, chain of
#                                              ENGINE_CHAIN (llama.cpp: LLAMACPP_CHAIN, draft on LLAMACPP_TD threads)
#                                              on the first ENGINE_LIMIT Spec-Bench prompts
# A block drafter drafts chains no longer than its block: K=4 TREE=none ENGINE_CHAIN=4 for the shipped DFlash (TREE=none
# skips the tree, which such a kind would draft as a chain of the tree's depth); collect runs judged with other
# settings in one table with chat_table.py itself (`python scripts/bench/chat_table/chat_table.py OUT RECIPE=RUN ...`).
# Env: LIMIT (80), TOKENS (128), K (5), TREE (dynamic-16, none), ENGINE_CHAIN (5), LLAMACPP_CHAIN (1), LLAMACPP_TD (1),
#      ENGINE_LIMIT (20; 0 skips both engines), ENGINES ("vllm llamacpp"), OUT (chat-table.json), NOTE (one page note).
# Cost on a 2-core CPU: about 6 x 5 min of evals and 2 x 10 min of engines per recipe. Loads the target: run it
# alone on the cores.
set -euo pipefail
cd "$(dirname "$0")/../../.."
[ $# -ge 2 ] && [ $(( $# % 2 )) = 0 ] || { echo "usage: chat_table.sh RECIPE RUN [RECIPE RUN ...]" >&2; exit 2; }
ds=${DS:-.venv/bin/draftsmith}
py=${PY:-.venv/bin/python}
args=("$@")
limit=${LIMIT:-80} tokens=${TOKENS:-128} k=${K:-5} tree=${TREE:-dynamic-16}
engine_limit=${ENGINE_LIMIT:-20} engine_chain=${ENGINE_CHAIN:-5}
specs=()
while [ $# -gt 0 ]; do
  recipe=$1 run=$2; shift 2
  [ -d "$run/drafter" ] || { echo "chat_table.sh: $run has no drafter/: finish draftsmith pipeline -c $recipe first" >&2; exit 2; }
  specs+=("$recipe=$run")
  for pset in spec-bench mt-bench; do
    short=$([ "$pset" = spec-bench ] && echo sb || echo mt)
    for shape in "chain-$k" $([ "$tree" = none ] || echo "$tree"); do
      name=$([ "$shape" = "$tree" ] && echo tree || echo "$shape")
      for temp in 0 0.7; do
        [ "$temp" = 0.7 ] && [ "$shape" = "$tree" ] && continue  # sampled: the chain only
        suffix=$([ "$temp" = 0.7 ] && echo -t07 || true)
        dir="$run/chat-$short-$name$suffix"
        [ -f "$dir/summary.json" ] || "$ds" eval -c "$recipe" --drafter "$run/drafter" --prompts "$pset" \
          --limit "$limit" --max-new-tokens "$tokens" --tree "$shape" --out "$dir" eval.temperature="$temp" \
          eval.baselines=false drafter.plan=false log.progress=false
      done
    done
  done
  if [ "$engine_limit" -gt 0 ]; then
    for engine in ${ENGINES:-vllm llamacpp}; do
      chain=$([ "$engine" = vllm ] && echo "$engine_chain" || echo "${LLAMACPP_CHAIN:-1}")
      own=$([ "$engine" = llamacpp ] && echo "--engine-draft-threads ${LLAMACPP_TD:-1} --engine-ngram ngram-simple --engine-no-quantized" || true)
      # shellcheck disable=SC2086
      [ -f "$run/chat-$engine/summary.json" ] || "$ds" eval -c "$recipe" --engine "$engine" --drafter "$run/drafter" \
        --prompts spec-bench --limit "$engine_limit" --max-new-tokens "$tokens" --dtype float32 --tree "chain-$chain" \
        --out "$run/chat-$engine" $own log.progress=false
    done
  fi
done
note=()
[ -n "${NOTE:-}" ] && note=(--note "$NOTE")
command="LIMIT=$limit TOKENS=$tokens K=$k TREE=$tree ENGINE_LIMIT=$engine_limit ENGINE_CHAIN=$engine_chain"
command+=" LLAMACPP_CHAIN=${LLAMACPP_CHAIN:-1} LLAMACPP_TD=${LLAMACPP_TD:-1} ENGINES='${ENGINES:-vllm llamacpp}'"
command+=" bash scripts/bench/chat_table/chat_table.sh$(printf ' %q' "${args[@]}")"
"$py" scripts/bench/chat_table/chat_table.py "${OUT:-chat-table.json}" "${specs[@]}" --command "$command" "${note[@]}"
