"""Self-distillation through vLLM on a page: docs/results/regen-vllm.md from regen_vllm.py's JSON."""

from __future__ import annotations

from draftsmith.eval.measure.campaign import Page, num, table


def render_regen_vllm(data: dict) -> list[str]:
    engine = next((r["vllm"].get("engine") for r in data["runs"] if r["vllm"].get("engine")), {}) or {}
    lines = ["Self-distillation (`draftsmith regenerate -c smollm2-regenerate`): the reference target "
             f"answers the first {data['prompts']} training prompts, at most {data['max_new_tokens']} "
             f"tokens, dtype {data['dtype']}, T={data['temperature']}, once with backend `hf` (batches of "
             f"{data['hf_batch']}) and once with backend `vllm` ({engine.get('package')} "
             f"{engine.get('version')}'s OpenAI server started for the stage, {data['vllm_concurrency']} "
             "requests in flight). tok/s: answer tokens over the answering time (the stage's own figure); "
             "wall: the whole command, with the target's load and, for vllm, the server's start. Same "
             "answers: conversations whose answer text is identical on both sides.", ""]
    rows = [[i + 1, num(r["hf"]["tokens_per_s"], 1), num(r["vllm"]["tokens_per_s"], 1),
             num(r["vllm_over_hf"], 2), num(r["hf"]["wall_s"], 1), num(r["vllm"]["wall_s"], 1),
             f"{r['same_answers']}/{data['prompts']}"]
            for i, r in enumerate(data["runs"])]
    lines += table(["run", "hf tok/s", "vllm tok/s", "vllm / hf", "hf wall s", "vllm wall s", "same answers"],
                   rows)
    return lines


PAGES = {  # docs/results/<name>.md from docs/results/data/<name>.json (scripts/bench/results_pages.py)
    "regen-vllm": Page(
        title="Self-distillation through vLLM against HF generate",
        summary="the regenerate stage with backend vllm (vLLM's server) and hf on the same prompts: "
                "tokens/s, wall time, identical answers",
        command="`python scripts/bench/regen_vllm/regen_vllm.py OUT`",
        render=render_regen_vllm),
}
