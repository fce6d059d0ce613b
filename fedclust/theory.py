"""Theorem 1 of PANM paper (§3.2.2, proof in Appendix A.1): how likely all k
CNI neighbours of a client are same-cluster in round t.

Parametrization (the paper's): ``n`` clients in all, ``a`` clients in the
client's own cluster *including itself* (so a-1 same-cluster peers among the
n-1 others; with c equal clusters a = n/c), ``l`` candidates drawn per round,
``k`` neighbours kept.

Assumption 1 of the paper: the similarity ranks every same-cluster peer
above every other peer.  Then the top k of a pool holding at least k
same-cluster peers are all same-cluster, and the question is one of drawing
balls: n-1 balls, a-1 white, l drawn per round without replacement.

- ``cni_probabilities`` is Theorem 1 as stated (Eq. 10):
  ``P^1(x) = R(x)``, ``P^t(x) = Σ_{m<x} G(m) P^{t-1}(x-m) + R(x)``, with
  ``G(x)`` the hypergeometric probability of x white balls among l and
  ``R(x)`` that of at least x.  It is ``Pr(s_1 + ... + s_t >= k)`` for
  independent per-round white counts s_c (Appendix A.1, question 2): it
  counts a peer drawn again in a later round as a new one, so it slightly
  overstates CNI.  This is the curve of the paper's Figure 3.
- ``cni_probabilities_exact`` is the exact probability for CNI as docs/algorithms.md
  runs it under Assumption 1: with W the same-cluster neighbours held,
  ``W^t = min(k, W^{t-1} + X)`` where X, the same-cluster candidates not
  already neighbours, is hypergeometric (l draws from n-1, a-1-W^{t-1}
  marked).  A Markov chain on {0..k}, computed exactly.
- ``pens_probability`` is Eq. 11: PENS draws afresh each round, ``P^t = R(k)``.

CLI: ``fedclust theory cni --n N --a A --l L --k K --rounds T [--json] [--exact]``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from fractions import Fraction

from fedclust.errors import ConfigError


def check_args(n: int, a: int, l: int, k: int, rounds: int = 1) -> None:
    """Refuse parameters outside the theorem's setting, naming the field and the fix."""
    if n < 2:
        raise ConfigError("--n", n, "needs at least 2 clients")
    if not 1 <= a <= n:
        raise ConfigError("--a", a, f"the cluster size (client included) must lie in [1, n={n}]")
    if not 1 <= l <= n - 1:
        raise ConfigError("--l", l, f"candidates are other clients: must lie in [1, n-1={n - 1}]")
    if not 1 <= k <= n - 1:
        raise ConfigError("--k", k, f"neighbours are other clients: must lie in [1, n-1={n - 1}]")
    if l < k:
        raise ConfigError("--l", l, f"CNI keeps the top k = {k} of l candidates a round, so l must be at least k "
                          "(as PANM and PENS require of algorithm.l): raise --l or lower --k")
    if rounds < 1:
        raise ConfigError("--rounds", rounds, "must be >= 1")


def hypergeom_pmf(total: int, marked: int, draws: int) -> list[Fraction]:
    """Exact ``Pr(x marked among draws)`` for x = 0..draws, drawing without
    replacement from ``total`` items of which ``marked`` are marked."""
    denom = math.comb(total, draws)
    return [Fraction(math.comb(marked, x) * math.comb(total - marked, draws - x), denom) for x in range(draws + 1)]


def G(n: int, a: int, l: int) -> list[Fraction]:
    """The paper's ``G(x)``, x = 0..l: exactly x same-cluster peers among l candidates (Eq. 19)."""
    return hypergeom_pmf(n - 1, a - 1, l)


def R(n: int, a: int, l: int, x: int) -> Fraction:
    """The paper's ``R(x)``: at least x same-cluster peers among l candidates (Eq. 20)."""
    g = G(n, a, l)
    return sum(g[max(x, 0):], Fraction(0))


def cni_probabilities(n: int, a: int, l: int, k: int, rounds: int) -> list[float]:
    """``[P^1(k), ..., P^T(k)]`` of Theorem 1 (PANM paper Eq. 10).  G and R
    are exact rationals rounded once to float; the recursion (sums of
    products of probabilities, no cancellation) runs in float64.  See the
    module docstring for the assumption and what the recursion counts."""
    check_args(n, a, l, k, rounds)
    g = [float(q) for q in G(n, a, l)] + [0.0] * max(0, k - l)
    r = [float(R(n, a, l, x)) for x in range(k + 1)]    # r[0] = 1
    p = list(r)                                          # P^1(x) = R(x), x = 0..k
    out = [p[k]]
    for _ in range(rounds - 1):
        p = [1.0] + [math.fsum(g[m] * p[x - m] for m in range(x)) + r[x] for x in range(1, k + 1)]
        out.append(p[k])
    return out


def cni_distribution_exact(n: int, a: int, l: int, k: int, rounds: int) -> list[list[float]]:
    """``[T][k+1]``: the exact distribution of the number W^t of same-cluster
    neighbours after round t of CNI under Assumption 1 (candidates drawn
    uniformly from all n-1 others, current neighbours included)."""
    check_args(n, a, l, k, rounds)
    # transition W -> min(k, W + X), X ~ Hypergeom(n-1, a-1-W, l); W = k is absorbing.
    # Exact rationals, rounded once to float; the chain then runs in float64.
    trans = [[Fraction(0)] * (k + 1) for _ in range(k + 1)]
    for w in range(k + 1):
        if w == k or a - 1 - w < 0:
            trans[w][w] = Fraction(1)
            continue
        for x, px in enumerate(hypergeom_pmf(n - 1, a - 1 - w, l)):
            trans[w][min(k, w + x)] += px
    tf = [[float(q) for q in row] for row in trans]
    p = [1.0] + [0.0] * k
    out = []
    for _ in range(rounds):
        p = [math.fsum(p[w] * tf[w][v] for w in range(k + 1)) for v in range(k + 1)]
        out.append(list(p))
    return out


def cni_probabilities_exact(n: int, a: int, l: int, k: int, rounds: int) -> list[float]:
    """``Pr(W^t = k)`` for t = 1..T: the exact counterpart of Theorem 1 for CNI."""
    return [d[k] for d in cni_distribution_exact(n, a, l, k, rounds)]


def cni_expected_precision_exact(n: int, a: int, l: int, k: int, rounds: int) -> list[float]:
    """``E[W^t] / k`` for t = 1..T: the expected neighbour precision of CNI under Assumption 1."""
    return [sum(w * q for w, q in enumerate(d)) / k for d in cni_distribution_exact(n, a, l, k, rounds)]


def pens_probability(n: int, a: int, l: int, k: int) -> float:
    """PENS stage one (PANM paper Eq. 11): ``P^t(k) = R(k)`` in every round."""
    check_args(n, a, l, k)
    return float(R(n, a, l, k))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedclust theory", description="Theory curves of PANM paper.")
    sub = parser.add_subparsers(dest="what", required=True)
    cni = sub.add_parser("cni", help="Theorem 1: P^t that all k CNI neighbours are same-cluster, t = 1..T")
    cni.add_argument("--n", type=int, required=True, help="clients in all")
    cni.add_argument("--a", type=int, required=True, help="clients in the own cluster, the client included (n/c)")
    cni.add_argument("--l", type=int, required=True, help="candidates drawn per round, at least k")
    cni.add_argument("--k", type=int, required=True, help="neighbours kept")
    cni.add_argument("--rounds", type=int, required=True, help="rounds T")
    cni.add_argument("--json", action="store_true", help="print one JSON list instead of one value a line")
    cni.add_argument("--exact", action="store_true",
                     help="exact CNI Markov chain instead of the paper's recursion (which counts re-drawn peers twice)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``fedclust theory cni ...``; ``argv`` are the words after ``theory``."""
    args = build_parser().parse_args(argv)
    fn = cni_probabilities_exact if args.exact else cni_probabilities
    try:
        probs = fn(args.n, args.a, args.l, args.k, args.rounds)
    except ConfigError as exc:
        print(f"fedclust theory: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(probs))
    else:
        print("\n".join(f"{p:.12g}" for p in probs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
