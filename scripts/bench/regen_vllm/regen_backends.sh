#!/usr/bin/env bash
# Regeneration backends on the same prompts, and a server killed mid-run:
#   bash scripts/bench/regen_vllm/regen_backends.sh OUT [PROMPTS]        (default 64 prompts of configs/runs/smollm2-regenerate.yaml)
# 1. backend hf: the target's own batched generate (batch 16), bf16;
# 2. backend openai against a real OpenAI-compatible server: `transformers serve` (transformers' own server,
#    /v1/completions; needs its serving extras: fastapi uvicorn openai, installed into .venv here if missing)
#    serving the same target folder in bf16, concurrency 4;
# 3. the same openai run with the server killed (kill -9) after a third of the answers: the run fails naming
#    the server, the server is restarted, the rerun completes; ids counted for duplicates and losses.
# Writes OUT/regen-backends.json (tokens/s per backend, answers, ids once). Keep the machine otherwise idle.
set -euo pipefail
out=${1:?usage: regen_backends.sh OUT [PROMPTS]}
n=${2:-64}
here=$(cd "$(dirname "$0")/../../.." && pwd)
py=$here/.venv/bin/python
ds=$here/.venv/bin/draftsmith
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
mkdir -p "$out"
"$py" -c "from transformers.utils.import_utils import is_serve_available as a; raise SystemExit(0 if a() else 1)" \
  || "$py" -m pip install -q fastapi uvicorn "openai>=1.98.0" starlette rich
folder=$("$py" -c "from draftsmith.distill.loading import resolve_target; print(resolve_target('smollm2-135m-instruct'))")
port=$("$py" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
recipe=(-c "$here/configs/runs/smollm2-regenerate.yaml" "data.regenerate.limit=$n" log.progress=false)
server=(data.regenerate.backend=openai "data.regenerate.url=http://127.0.0.1:$port/v1" data.regenerate.concurrency=4
        data.regenerate.retries=2 data.regenerate.backoff=0.5 data.regenerate.timeout=300)

start_server() {
  "$here/.venv/bin/transformers" serve "$folder" --port "$port" --dtype bfloat16 --device cpu --log-level warning \
    > "$out/server.log" 2>&1 &
  echo $! > "$out/server.pid"
  for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$port/v1/models" > /dev/null && return 0
    sleep 1
  done
  echo "server did not come up: $out/server.log" >&2
  return 1
}
stop_server() { kill -9 "$(cat "$out/server.pid")" 2>/dev/null || true; wait "$(cat "$out/server.pid")" 2>/dev/null || true; }
trap stop_server EXIT

rm -rf "$out/hf" "$out/openai" "$out/openai-killed"
/usr/bin/time -f "%e" -o "$out/hf.wall" "$ds" regenerate "${recipe[@]}" --out "$out/hf" | tee "$out/hf.log"
start_server
/usr/bin/time -f "%e" -o "$out/openai.wall" "$ds" regenerate "${recipe[@]}" "${server[@]}" --out "$out/openai" \
  | tee "$out/openai.log"
# the kill: wait for a third of the answers, kill the server, let the run fail, restart, rerun
( rc=0; "$ds" regenerate "${recipe[@]}" "${server[@]}" --out "$out/openai-killed" > "$out/killed-first.log" 2>&1 || rc=$?
  echo $rc > "$out/killed-first.rc" ) &
run=$!
file="$out/openai-killed/regenerated.jsonl"
until [ -f "$file" ] && [ "$(wc -l < "$file")" -ge $(( n / 3 )) ]; do
  kill -0 $run 2>/dev/null || { echo "the run ended before the kill: $out/killed-first.log" >&2; exit 1; }
  sleep 0.5
done
stop_server
wait $run || true
start_server
"$ds" regenerate "${recipe[@]}" "${server[@]}" --out "$out/openai-killed" > "$out/killed-rerun.log" 2>&1
stop_server
"$py" "$here/scripts/bench/regen_vllm/backends_report.py" "$out" "$n"
