"""The exactness tests' power, as JSON: each subtle twin's total variation from the target's law and the
probability that the test's draws catch it (enumerated laws, tests/exactness.py), plus the power against
a generic TV 0.03 alternative for every sampled test; and for the decoder-level tests at depth
(tests/unit/test_exact_depth.py: 4-token outputs, the parallel drafters' blocks among them) the TV each
detects at 95 %, the correct decoder's p-value and each negative twin's p-value and histogram TV, run through
the batched decoder (a few minutes); and the enumeration tests (tests/unit/test_exact_enumeration.py: every
random outcome of the batch-1 decoder replayed, each mode's and each twin's exact distance from the target's
law).
    python scripts/bench/exactness/exactness_power.py OUT.json [--keep-sampled OLD.json]

`--keep-sampled OLD.json` keeps the sampled (histogram) tests' rows of an earlier run, with its date, host and
command recorded as `sampled_rows_from`, and measures the enumeration tests again."""

import contextlib
import functools
import json
import sys
from pathlib import Path
from unittest import mock

from draftsmith.eval.measure.campaign import command_line, host_block, load_file

ROOT = Path(__file__).resolve().parents[3]
# the tests whose power this measures, loaded from their files (test code, not package code); helpers and
# exactness first, under their own names: the test modules import them by name
chi_square_p_value = load_file(ROOT / "tests" / "helpers.py").chi_square_p_value
exactness = load_file(ROOT / "tests" / "exactness.py")
depth = load_file(ROOT / "tests" / "unit" / "test_exact_depth.py")
dec = load_file(ROOT / "tests" / "unit" / "test_sampling.py")
toy = load_file(ROOT / "tests" / "unit" / "test_verify.py")
load_file(ROOT / "tests" / "families.py")
enum = load_file(ROOT / "tests" / "unit" / "test_exact_enumeration.py")


def depth_cases(draft):
    """(test, prompt, sampling, proposer, twin name, twin proposer, twin patch) for every test at depth."""
    from draftsmith.heads.runtime.verify import SamplingConfig

    lookup_given_q = exactness.lookup_given_root_q(depth.hybrid.merge)

    keep_p = functools.partial(depth.decoder_module.verify_sampling, residual=exactness.keep_p_update)
    cases = []
    for name, sampling in depth.SAMPLINGS.items():
        if sampling.top_k or sampling.top_p < 1:
            twin = ("q reported without its truncation",
                    depth.chain(draft, depth.TwinChain,
                                reported=SamplingConfig(temperature=sampling.temperature)), None)
        else:
            twin = ("old confidence stop (token dropped)",
                    depth.chain(draft, depth.TwinChain, drop_unconfident=True), None)
        cases.append((f"sampled chain-2, confidence stop {depth.THRESHOLD}", name, depth.PROMPT, sampling,
                      depth.chain(draft), *twin))
    t1 = depth.SAMPLINGS["T=1"]
    cases.append(("hybrid: sampled chain-2 + lookup branch", "T=1", depth.PROMPT, t1,
                  depth.hybrid_proposer(draft), "lookup branch given the drafter's q",
                  depth.hybrid_proposer(draft), mock.patch.object(depth.hybrid, "merge", lookup_given_q)))
    cases.append(("lookup trie, 2 matches + datastore", "T=1", depth.PROMPT_TRIE, t1, depth.trie_proposer(),
                  "p kept after a rejected sibling", depth.trie_proposer(),
                  mock.patch.object(depth.decoder_module, "verify_sampling", keep_p)))
    return cases


def depth_rows() -> list[dict]:
    import torch

    torch.set_num_threads(1)
    base = depth.build_tiny_model("llama", layers=3, seed=11, vocab_size=depth.V)
    base.generation_config.eos_token_id = 99
    target = depth.Target(base, tokenizer=None, name="tiny-v4")
    draft = depth.build_tiny_model("llama", layers=1, seed=5, vocab_size=depth.V)
    cases = [(target, *case) for case in depth_cases(draft)]
    for kind in ("dflash", "peagle"):  # the parallel drafters: a block of 2 drawn from one forward
        own, drafter = depth.parallel_pair(kind)
        for setting in ("T=1", "T=1.3 top-p 0.8"):
            cases.append((own, f"{kind} block of 2, confidence stop {depth.THRESHOLD}", setting, depth.PROMPT,
                          depth.SAMPLINGS[setting], depth.parallel_proposer(kind, drafter),
                          "greedy slots reported as sampled",
                          depth.parallel_proposer(kind, drafter, greedy_slots=True), None))
    rows = []
    for target, test, setting, prompt, sampling, proposer, twin_name, twin, patch in cases:
        model = target.model
        exact = exactness.output_law(model, prompt, depth.LENGTH, sampling)
        counts, accepted, deep = depth.counts_of(target, proposer, prompt, sampling)
        with patch or contextlib.nullcontext():
            twin_counts, _, _ = depth.counts_of(target, twin, prompt, sampling)
        rows.append({"test": "test_exact_depth (batched decoder, 4 tokens)", "mode": test,
                     "sampling": setting, "draws": depth.DRAWS, "cells": int(exact.numel()),
                     "detects_tv": exactness.detectable_tv(exact, depth.DRAWS),
                     "p_value": chi_square_p_value(counts, exact), "depth2_accepts": deep,
                     "draft_tokens_accepted": accepted, "twin": twin_name,
                     "twin_p_value": chi_square_p_value(twin_counts, exact),
                     "twin_histogram_tv": round(exactness.tv(twin_counts / twin_counts.sum(), exact), 4),
                     "correct_histogram_tv": round(exactness.tv(counts / counts.sum(), exact), 4)})
        r = rows[-1]
        print(f"{test:42s} {setting:16s} detects TV {r['detects_tv']}  p {r['p_value']:.3g}  depth-2 {deep}  "
              f"twin '{twin_name}' p {r['twin_p_value']:.3g}", flush=True)
    return rows


def enumeration_rows() -> list[dict]:
    """Every drafting mode, each negative twin and each family of test_exact_enumeration, measured."""
    import torch

    torch.set_num_threads(1)
    rows = []

    def add(group: str, name: str, case, twin_of: str | None = None):
        r = enum.measure(case)
        rows.append({"test": "test_exact_enumeration (batch-1 decoder)", "group": group, "mode": name,
                     "twin_of": twin_of, "sampling": repr(case.sampling), "verifications": case.verifications,
                     "length": case.length, "tolerance": case.tol if twin_of is None else enum.TWIN_TV,
                     **{k: r[k] for k in ("tv", "outcomes", "runs", "deep", "non_first")},
                     "tree": case.tree})
        print(f"{group:8s} {name:58s} TV {r['tv']:.2e}  outcomes {r['outcomes']}  deep {r['deep']:.3f}  "
              f"non-first {r['non_first']:.3f}", flush=True)

    for name, case in enum.cases().items():
        add("mode", name, case)
    for name, (mode, case) in enum.twins().items():
        add("twin", name, case, twin_of=mode)
    for name in enum.FAMILIES:
        add("family", name, enum.family_case(name))
    for name in ("qwen3_5", "falcon_h1"):
        add("twin", f"{name}: recurrent state kept from branch row 0", enum.family_twin(name),
            twin_of=f"{name} tree over two verifications")
    return rows


def main(out: str, keep: str | None = None) -> None:
    if keep:  # the sampled tests' rows as recorded before (their draws take half an hour), enumeration anew
        old = json.loads(Path(keep).read_text())
        rows = [r for r in old["rows"] if "group" not in r] + enumeration_rows()
        result = {"alpha": exactness.ALPHA, "required_power": exactness.POWER, "rows": rows,
                  "command": command_line(), "host": host_block(),
                  "sampled_rows_from": {"date": old["host"].get("date"), "command": old["command"],
                                        "host": old["host"]}}
        Path(out).write_text(json.dumps(result, indent=2) + "\n")
        return
    rows = []
    for shape, twins in toy.TWINS.items():
        rows.append({"test": "test_verify (toy rule)", "rule": shape, "twin": None, "draws": toy.DRAWS,
                     "cells": toy.TOY_V ** 2, "tv": 0.03,
                     "power": exactness.power(toy.EXACT, exactness.perturbed(toy.EXACT, 0.03), toy.DRAWS)})
        for twin in twins:
            law = toy._enumerated_law(shape, twin)
            rows.append({"test": "test_verify (toy rule)", "rule": shape, "twin": twin, "draws": toy.DRAWS,
                         "cells": toy.TOY_V ** 2, "tv": round(exactness.tv(law, toy.EXACT), 4),
                         "power": exactness.power(toy.EXACT, law, toy.DRAWS)})
    target = dec.Target(dec.build_tiny_model("llama", layers=3, seed=11, vocab_size=dec.V), None, "tiny")
    law = exactness.model_law(target.model)
    first = law(dec.PROMPT)
    import torch

    exact = torch.stack([first[x1] * law(dec.PROMPT + [x1]) for x1 in range(dec.V)])
    rows.append({"test": "test_sampling (batched decoder)", "rule": "draft-lm sampled chain", "twin": None,
                 "draws": dec.DRAWS, "cells": dec.V ** 2, "tv": 0.03,
                 "power": exactness.power(exact, exactness.perturbed(exact, 0.03), dec.DRAWS)})
    rows += depth_rows()
    rows += enumeration_rows()
    result = {"alpha": exactness.ALPHA, "required_power": exactness.POWER, "rows": rows,
              "command": command_line(), "host": host_block()}
    Path(out).write_text(json.dumps(result, indent=2) + "\n")
    for r in rows:
        if "tv" not in r:
            continue
        print(f"{r['test']:32s} {r['rule']:26s} {str(r['twin']):32s} TV {r['tv']:.3f}  power "
              f"{r['power']:.3f}")


if __name__ == "__main__":
    args = sys.argv[1:]
    keep = args[args.index("--keep-sampled") + 1] if "--keep-sampled" in args else None
    main(args[0] if args and not args[0].startswith("--") else "exactness_power.json", keep)
