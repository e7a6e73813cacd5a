"""The on-policy ceiling on a page: docs/results/onpolicy-ceiling.md from onpolicy_ceiling.py's JSON."""

from __future__ import annotations

from draftsmith.eval.measure.campaign import Page, num, table


def render_onpolicy_ceiling(data: dict) -> list[str]:
    dtypes = data["dtypes"]
    any_row = next(iter(dtypes.values()))
    depth = data["depth"]
    lines = [f"How much of training-time test is already on-policy at T=0, on {any_row['sequences']} of "
             f"`{data['config']}`'s training answers ({any_row['answer_tokens']:,} answer tokens; sources "
             f"{', '.join(data['data'])}; seeded sample, seed {data['seed']}). A verification at T=0 accepts "
             "a drafted token only where it is the target's argmax after the accepted prefix; training-time "
             "test trains depth j on the data's j tokens before the label as the drafted prefix. Where each "
             "of them is the target's argmax (teacher-forced, in the dtype named), depth j trains on a "
             "prefix a verification accepts: that share is what on-policy training (Draft-OPD: the drafter's "
             "own rollouts, the target's distribution where they go) leaves unchanged; it can only change "
             "the rest. Where the answers are the target's own greedy answers (the reference recipe's are: "
             "smollm2-selfdistill-*, greedy in bfloat16, distill/corpora/LICENSES.md), a token disagrees "
             "where the teacher-forced forward in the named dtype picks another argmax than the generation "
             "did.", ""]
    lines += table(["target dtype", "answer tokens = target's argmax", "answers reproduced whole",
                    *[f"on-policy share, depth {j}" for j in range(depth)]],
                   [[name, num(r["token_agreement"], 4), num(r["answers_identical"], 3),
                     *[num(s, 3) for s in r["onpolicy_share"]]] for name, r in dtypes.items()])
    return lines


PAGES = {  # docs/results/<name>.md from docs/results/data/<name>.json (scripts/bench/results_pages.py)
    "onpolicy-ceiling": Page(
        title="On-policy drafter training: how much of training-time test it could change",
        summary="the recipe's answers teacher-forced through the target: answer tokens equal to its argmax, "
                "and the share of each TTT depth whose drafted prefix a T=0 verification accepts",
        command="`python scripts/bench/onpolicy_ceiling/onpolicy_ceiling.py OUT.json`",
        render=render_onpolicy_ceiling),
}
