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

import functools
import itertools
from collections import defaultdict
from dataclasses import dataclass

import pytest
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
    plain forwards over its support (`exact_law`), as a dense float64 tensor [V] * length."""
    vocab = model.config.get_text_config().vocab_size
    law = torch.zeros([vocab] * length, dtype=torch.float64)
    for seq, w in exact_law(model, prompt, sampling, length).items():
        law[seq] = w
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


# --- exact enumeration through the real decoder: every random outcome replayed, no sampling noise ----------

class _Stop(Exception):
    """Raised by the verifier's wrapper after the last verification an enumeration looks at."""


class Replay:
    """Depth-first replay of every random outcome of a deterministic run.

    The run's randomness is answered from a script of choices: `torch.multinomial` picks one token of the
    law's support, and each uniform `verify_sampling` draws is symbolic, so `u * q_x < p_x` is a choice
    between accept (probability min(1, p_x / q_x)) and reject. A choice past the script's end takes its
    first option; after a run `advance` moves to the next script (the last choice with options left), so
    repeated runs visit every outcome once, each weighted by the product of its choices'
    probabilities. Options of probability 0 are never offered and a certain comparison is no choice at all."""

    def __init__(self):
        self.stack: list[list[int]] = []  # [choice, options] per choice point of the current run
        self.pos, self.weight = 0, 1.0

    def choose(self, probs: list[float]) -> int:
        if self.pos == len(self.stack):
            self.stack.append([0, len(probs)])
        choice, options = self.stack[self.pos]
        assert options == len(probs), "a replayed run took another path: the run is not deterministic"
        self.pos += 1
        self.weight *= probs[choice]
        return choice

    def advance(self) -> bool:
        del self.stack[self.pos:]
        while self.stack and self.stack[-1][0] + 1 == self.stack[-1][1]:
            self.stack.pop()
        if not self.stack:
            return False
        self.stack[-1][0] += 1
        self.pos, self.weight = 0, 1.0
        return True

    # what torch.multinomial / torch.rand become during a run
    def multinomial(self, probs, num_samples=1, replacement=False, *, generator=None, out=None):
        assert num_samples == 1 and probs.dim() == 1, "the decoder draws one token from one law at a time"
        p = probs.detach().double()
        p = p / p.sum()
        support = (p > 0).nonzero().flatten().tolist()
        return torch.tensor([support[self.choose([float(p[j]) for j in support])]])

    def rand(self, n: int, *, generator=None, device=None):  # verify_sampling: one uniform per node
        return _Uniforms(self, n)


class _Uniforms:
    def __init__(self, replay: Replay, n: int):
        self.replay, self.n = replay, n

    def tolist(self) -> list:
        return [_Uniform(self.replay) for _ in range(self.n)]


class _Uniform:
    """A uniform on [0, 1) known only through the comparisons made with it (each node's is used once)."""

    def __init__(self, replay: Replay, scale: float = 1.0):
        self.replay, self.scale = replay, scale

    def __mul__(self, other) -> _Uniform:
        return _Uniform(self.replay, self.scale * float(other))

    __rmul__ = __mul__

    def __lt__(self, bound) -> bool:
        bound = float(bound)
        a = (1.0 if bound > 0 else 0.0) if self.scale == 0 else min(1.0, max(0.0, bound / self.scale))
        if a in (0.0, 1.0):
            return a == 1.0
        return self.replay.choose([a, 1.0 - a]) == 0


@dataclass
class Enumeration:
    """The law of what a decoder emits: {first token + the tokens of its first verifications: probability},
    with the probability mass of outcomes where a verification accepted a path of depth >= 2 (`deep`) or a
    node that is not its parent's first child (`non_first`), and the runs it took."""

    law: dict[tuple, float]
    deep: float
    non_first: float
    runs: int


def enumerate_decoder(decoder, prompt: list[int], sampling, verifications: int = 1,
                      max_runs: int = 50000) -> Enumeration:
    """Every random outcome of `decoder.generate(prompt)` (the batch-1 path) up to and including its
    `verifications`-th verification, replayed one run each (`Replay`) through the real decoder, proposer and
    acceptance rule (whatever `decoder_module.verify_sampling` is at call time, so a twin patched there is
    enumerated too)."""
    from draftsmith.eval.decode import decoder as decoder_module

    replay = Replay()
    rule = decoder_module.verify_sampling
    emitted: list[int] = []
    marks = {"deep": False, "non_first": False, "calls": 0}

    def first_tokens(last, s, g):
        first = type(decoder)._first_tokens(decoder, last, s, g)
        emitted.extend(first)
        return first

    def verify(tokens, buffers, target_probs, draft_probs=None, generator=None):
        verdict = rule(tokens, buffers, target_probs, draft_probs, generator)
        emitted.extend(verdict.tokens)
        marks["deep"] |= len(verdict.accepted) >= 2
        parent_of = {c: u for u, kids in enumerate(buffers.children) for c in kids}
        marks["non_first"] |= any(buffers.children[parent_of[c]][0] != c for c in verdict.accepted)
        marks["calls"] += 1
        if marks["calls"] == verifications:
            raise _Stop
        return verdict

    law: dict[tuple, float] = defaultdict(float)
    deep = non_first = 0.0
    runs = 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(decoder, "_first_tokens", first_tokens)
        mp.setattr(decoder_module, "verify_sampling", verify)
        mp.setattr(torch, "multinomial", replay.multinomial)
        mp.setattr(torch, "rand", replay.rand)
        while True:
            emitted.clear()
            marks.update(deep=False, non_first=False, calls=0)
            try:
                decoder.generate(prompt, 10 ** 6, sampling)
                raise AssertionError("the decoder stopped before its verifications were all made")
            except _Stop:
                pass
            law[tuple(emitted)] += replay.weight
            deep += replay.weight * marks["deep"]
            non_first += replay.weight * marks["non_first"]
            runs += 1
            assert runs <= max_runs, "too many outcomes to enumerate: shrink the vocabulary, tree or settings"
            if not replay.advance():
                break
    return Enumeration(dict(law), deep, non_first, runs)


def target_continuation(model, sampling, prompt: list[int]):
    """ids after `prompt` -> the target's next-token law [V] (float64, warped by `sampling`), memoised."""
    from draftsmith.heads.runtime.verify import logits_to_probs

    @functools.lru_cache(maxsize=None)
    def law(ids: tuple) -> torch.Tensor:
        with torch.no_grad():
            return logits_to_probs(model(torch.tensor([prompt + list(ids)])).logits[0, -1], sampling).double()
    return law


def composed_law(model, prompt: list[int], sampling, law: dict[tuple, float],
                 length: int) -> dict[tuple, float]:
    """The law of the first `length` tokens when the decoder's outcomes (`law`) are continued by the target's
    own sampling: an outcome longer than `length` is cut, a shorter one extended with the target's laws."""
    nxt = target_continuation(model, sampling, prompt)
    out: dict[tuple, float] = defaultdict(float)

    def extend(seq: tuple, w: float):
        if len(seq) >= length:
            out[seq[:length]] += w
            return
        p = nxt(seq)
        for y in (p > 0).nonzero().flatten().tolist():
            extend(seq + (y,), w * float(p[y]))

    for seq, w in law.items():
        extend(seq, w)
    return dict(out)


def exact_law(model, prompt: list[int], sampling, length: int) -> dict[tuple, float]:
    """The target's own law of its first `length` tokens (its support only: a truncated law stays small)."""
    return composed_law(model, prompt, sampling, {(): 1.0}, length)


def law_tv(a: dict[tuple, float], b: dict[tuple, float]) -> float:
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))
