"""Power for the exactness tests: enumerated laws of acceptance rules, and how often a test catches them.

A sampling test draws N outputs from the decoder and compares their histogram with the target's exact
law (Pearson chi-square, fail at p < ALPHA). That only means something if a wrong rule would fail it:
for each negative twin we enumerate the twin's own law exactly (no sampling), and estimate the
probability that N draws from it fail the test (`power`), by drawing N-sample histograms from the
enumerated law (cheap: no decoder in the loop). Tests assert power >= 0.95 and state TV and power.

`rule_law` is that enumeration for one verification step of multi-draft recursive rejection sampling
over a tree, with the update after a rejection and the q the verifier is given as parameters: the
correct rule's enumerated law equals the target's (a check of the enumeration itself), and the twins'
laws are what the same walk gives with one piece wrong.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

import torch
from helpers import chi_square_p_value

ALPHA = 1e-3  # a correct rule fails a test with this probability; the seeds are fixed, so it never flips
POWER = 0.95  # required probability that a twin fails


def tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a.double() - b.double()).abs().sum())


def power(exact: torch.Tensor, alternative: torch.Tensor, draws: int, reps: int = 400,
          seed: int = 0) -> float:
    """P(a histogram of `draws` samples from `alternative` fails the chi-square test against `exact`)."""
    g = torch.Generator().manual_seed(seed)
    flat = alternative.double().flatten().clamp_min(0)
    samples = torch.multinomial(flat.expand(reps, -1), draws, replacement=True, generator=g)  # [reps, draws]
    counts = torch.zeros(reps, flat.numel(), dtype=torch.long).scatter_add_(1, samples,
                                                                            torch.ones_like(samples))
    return sum(chi_square_p_value(c.reshape(exact.shape), exact) < ALPHA for c in counts) / reps


def perturbed(exact: torch.Tensor, distance: float) -> torch.Tensor:
    """A generic alternative at total variation `distance` from a [V, V] law: mixed towards the law with
    the same marginal of x1 and x2 drawn independently of x1 (the kind of dependence a rule bug breaks)."""
    independent = exact.sum(1, keepdim=True) * exact.sum(0, keepdim=True)  # [V, V]
    eps = distance / tv(independent, exact)
    assert 0 < eps <= 1, "the law is too close to independent for this distance"
    return (1 - eps) * exact + eps * independent


def correct_update(p, q, x):
    from draftsmith.heads.runtime.verify import rejection_residual

    return rejection_residual(p, q, x)


def unnormalised_update(p, q, x):
    """Twin: the residual max(p - q, 0) left unnormalised for the next sibling."""
    residual = p.clone()
    if q is None:
        residual[x] = 0.0
    else:
        residual = (p - q).clamp_min(0.0)
    return residual


def keep_p_update(p, q, x):
    """Twin: p kept as it was after a rejection (the rejected token can come back as the bonus)."""
    return p


def lookup_given_root_q(real_merge):
    """Twin of heads/runtime/hybrid.py `merge`: the lookup nodes handed the drafter's q of the root (as if
    they were sampled) instead of a point mass."""
    def sloppy(model, lookup):
        merged = real_merge(model, lookup)
        if merged.probs is not None and merged.n > model.n:
            merged.probs[model.n:] = model.probs[0]
        return merged
    return sloppy


def rule_law(parents: list[int], draft, target_at, update=correct_update,
             verifier_q=None) -> dict[tuple, float]:
    """Exact law of the tokens one verification emits (accepted drafts + bonus).

    draft: [(weight, tokens, q rows or None)] — every draft the proposer can make, with its probability
    (a deterministic proposer: one entry, q None). target_at(j, tokens) -> the target's law [V] after
    tree index j. verifier_q(q rows) -> the q the verifier is handed (a wrong-q twin); default: the truth.
    """
    children = defaultdict(list)
    for i, par in enumerate(parents):
        children[par + 1].append(i + 1)
    law: dict[tuple, float] = defaultdict(float)

    def try_children(u, k, p, prob, emitted, tokens, q_rows):
        kids = children[u]
        if k == len(kids):
            p = p.double() / p.double().sum()
            for y in range(len(p)):
                if p[y] > 0:
                    law[emitted + (y,)] += prob * float(p[y])
            return
        c = kids[k]
        x = tokens[c - 1]
        q = None if q_rows is None else q_rows[c - 1]
        q_x = 1.0 if q is None else float(q[x])
        a = (1.0 if p[x] > 0 else 0.0) if q_x == 0 else min(1.0, float(p[x]) / q_x)
        if a > 0:
            try_children(c, 0, target_at(c, tokens), prob * a, emitted + (x,), tokens, q_rows)
        if a < 1:
            try_children(u, k + 1, update(p, q, x), prob * (1 - a), emitted, tokens, q_rows)

    for weight, tokens, q_rows in draft:
        shown = q_rows if verifier_q is None or q_rows is None else verifier_q(q_rows)
        try_children(0, 0, target_at(0, tokens), weight, (), tokens, shown)
    return dict(law)


def first_two(step_law, start: int, vocab: int) -> torch.Tensor:
    """[V, V] law of the first two generated tokens when `step_law(last)` is one verification's law."""
    out = torch.zeros(vocab, vocab, dtype=torch.float64)
    for seq, w in step_law(start).items():
        if len(seq) >= 2:
            out[seq[0], seq[1]] += w
        else:
            for nxt, w2 in step_law(seq[0]).items():
                out[seq[0], nxt[0]] += w * w2
    return out


def markov_drafts(Q: torch.Tensor, parents: list[int], last: int, sampled: bool):
    """Every draft over a tree from a Markov draft table Q [V, V]: sampled (each node from Q[its parent's
    token], i.i.d. siblings) with its weight and q rows, or deterministic (top-k of Q per level)."""
    vocab, n = Q.shape[0], len(parents)
    if not sampled:
        tokens: list[int] = []
        for i, par in enumerate(parents):
            prev = last if par < 0 else tokens[par]
            rank = sum(1 for j in range(i) if parents[j] == par)
            tokens.append(int(Q[prev].topk(rank + 1).indices[rank]))
        return [(1.0, tokens, None)]
    out = []
    for tokens in itertools.product(range(vocab), repeat=n):
        prev = [last if par < 0 else tokens[par] for par in parents]
        weight = 1.0
        for x, pr in zip(tokens, prev):
            weight *= float(Q[pr, x])
        if weight > 0:
            out.append((weight, list(tokens), Q[prev]))
    return out


def record_verifications(monkeypatch, decoder_module) -> list[tuple]:
    """Spy on the decoder's sampling verifier: every call's (tokens, parents-as-buffers, target_probs,
    draft_probs, verdict), in order, while the real rule runs."""
    from draftsmith.heads.runtime import verify

    calls = []

    def spy(tokens, buffers, target_probs, draft_probs=None, generator=None):
        verdict = verify.verify_sampling(tokens, buffers, target_probs, draft_probs, generator)
        calls.append((list(tokens), buffers, target_probs.detach().double(),
                      None if draft_probs is None else draft_probs.detach().double(), verdict))
        return verdict

    monkeypatch.setattr(decoder_module, "verify_sampling", spy)
    return calls


def check_verifier_inputs(calls, prompt: list[int], output_ids: list[int], target_law, draft_law=None,
                          atol: float = 1e-5, point_masses: bool = False) -> int:
    """Each verification of one B=1 generation saw, for every tree node, the target's exact law after that
    node's context (`target_law(ids) -> [V]`) and, for sampled drafts, the law each draft token was drawn
    from (`draft_law(ids)`, at the node's parent; with `point_masses`, a one-hot row on the node's own
    token stands for a deterministic node). Contexts are rebuilt from the emitted tokens, so a
    decoder that kept other tokens than the verdict's would fail here too. Returns the nodes checked."""
    context, checked, emitted = list(prompt) + output_ids[:1], 0, 1
    for tokens, buffers, target_probs, draft_probs, verdict in calls:
        parents = [-1] * len(tokens)
        for u, kids in enumerate(buffers.children):
            for c in kids:
                parents[c - 1] = u - 1
        path = {0: []}
        for c in range(1, len(tokens) + 1):
            path[c] = path[parents[c - 1] + 1] + [tokens[c - 1]]
        for j in range(len(tokens) + 1):
            assert torch.allclose(target_probs[j], target_law(context + path[j]),
                                  atol=atol), (("target row", j))
            if draft_probs is not None and j > 0:
                row = draft_probs[j - 1]
                if point_masses and float(row[tokens[j - 1]]) == 1.0 and float(row.sum()) == 1.0:
                    checked += 1  # a deterministic node (hybrid: a lookup token) as a point mass on its token
                    continue
                parent_path = path[parents[j - 1] + 1]
                assert torch.allclose(row, draft_law(context + parent_path), atol=atol), ("q row", j)
            checked += 1
        assert (output_ids[emitted: emitted + len(verdict.tokens)]
                == verdict.tokens[: len(output_ids) - emitted])
        context += verdict.tokens
        emitted += len(verdict.tokens)
    assert emitted >= len(output_ids), "the output holds tokens no verification emitted"
    return checked


def model_law(model, temperature: float = 1.0):
    """ids -> the model's next-token law [V] (float64) after them, by a plain forward."""
    def law(ids):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1].double()
        return (logits / temperature).softmax(-1)
    return law


# --- laws of whole outputs: the decoder-level tests at depth (tests/unit/test_exact_depth.py) ---------------

def output_law(model, prompt: list[int], length: int, sampling) -> torch.Tensor:
    """The target's exact law of its first `length` tokens after `prompt` under `sampling` (temperature,
    top-k, top-p: heads/runtime/verify.py `logits_to_probs`, the warping the decoder promises to keep), by
    plain forwards: a float64 tensor [V] * length. V ** (length - 1) forwards: tiny vocabularies only."""
    from draftsmith.heads.runtime.verify import logits_to_probs

    def next_law(ids):
        with torch.no_grad():
            return logits_to_probs(model(torch.tensor([ids])).logits[0, -1], sampling).double()  # [V]

    law = next_law(prompt)
    for _ in range(length - 1):
        vocab = law.shape[-1]
        rows = torch.stack([next_law(prompt + list(seq))
                            for seq in itertools.product(range(vocab), repeat=law.dim())])
        law = law.unsqueeze(-1) * rows.reshape(*law.shape, vocab)  # [V]*k x [V]
    return law


def perturbed_output(exact: torch.Tensor, distance: float) -> torch.Tensor:
    """`perturbed` for a law of several tokens: mixed towards the first token drawn independently of the rest
    (same marginals, then kept on `exact`'s support: outcomes top-k / top-p make impossible would be caught
    by any test), at total variation `distance` from `exact`."""
    first = exact.sum(tuple(range(1, exact.dim())), keepdim=True)
    rest = exact.sum(0, keepdim=True)
    independent = first * rest * (exact > 0)
    independent = independent / independent.sum()
    eps = distance / tv(independent, exact)
    assert 0 < eps <= 1, "the law is too close to independent for this distance"
    return (1 - eps) * exact + eps * independent


def detectable_tv(exact: torch.Tensor, draws: int,
                  grid=(0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.07, 0.1)):
    """The smallest TV on `grid` at which a generic alternative (perturbed_output) fails the test with
    probability >= POWER, given `draws` samples: the distance the test is stated to detect."""
    for distance in grid:
        if power(exact, perturbed_output(exact, distance), draws, reps=200) >= POWER:
            return distance
    return None


def decoder_counts(decoder, prompt: list[int], length: int, sampling, draws: int, seed: int,
                   rows: int = 200) -> tuple[torch.Tensor, int, int]:
    """Histogram [V] * length of `draws` outputs of the batched decoder (`rows` copies of `prompt` per call),
    the draft tokens it accepted, and how many verifications accepted a path of depth >= 2."""
    vocab = decoder.target.vocab_size
    g = torch.Generator().manual_seed(seed)
    counts, accepted, deep = torch.zeros([vocab] * length, dtype=torch.long), 0, 0
    for _ in range(draws // rows):
        for r in decoder.generate_batch([prompt] * rows, length, sampling, g).results:
            counts[tuple(r.output_ids[:length])] += 1
            accepted += sum(r.accepted_drafts)
            deep += sum(a >= 2 for a in r.accepted_drafts)
    return counts, accepted, deep
