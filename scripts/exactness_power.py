"""The exactness tests' power, as JSON: each subtle twin's total variation from the target's law and the
probability that the test's draws catch it (enumerated laws, tests/exactness.py), plus the power against
a generic TV 0.03 alternative for every sampled test.   python scripts/exactness_power.py OUT.json"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "unit")]

import exactness  # noqa: E402
import test_sampling as dec  # noqa: E402
import test_verify as toy  # noqa: E402


def main(out: str) -> None:
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
    result = {"alpha": exactness.ALPHA, "required_power": exactness.POWER, "rows": rows}
    Path(out).write_text(json.dumps(result, indent=2) + "\n")
    for r in rows:
        print(f"{r['test']:32s} {r['rule']:26s} {str(r['twin']):32s} TV {r['tv']:.3f}  power {r['power']:.3f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "exactness_power.json")
