"""Theorem 1 of papers/001 against brute-force enumeration, the paper's
printed factorial formulas, scipy and a Monte-Carlo run of the CNI code."""

import itertools
import json
import math
from fractions import Fraction

import pytest
import torch

from fedclust.algorithms.cni import cni_step, draw_candidates
from fedclust.errors import ConfigError
from fedclust.theory import (
    G,
    R,
    cni_distribution_exact,
    cni_expected_precision_exact,
    cni_probabilities,
    cni_probabilities_exact,
    main,
    pens_probability,
)

SMALL = [(7, 4, 2, 2, 3), (8, 3, 3, 2, 3), (7, 4, 3, 3, 3), (6, 6, 2, 2, 2), (8, 4, 3, 1, 2)]


def fact_ratio(num, den):
    """prod(num!) / prod(den!) as a Fraction; 0 when a denominator argument is negative."""
    if any(d < 0 for d in den):
        return Fraction(0)
    out = Fraction(1)
    for v in num:
        out *= math.factorial(v)
    for v in den:
        out /= math.factorial(v)
    return out


def paper_G(n, a, l, x):
    """G(x) exactly as printed under Theorem 1 (Eq. 10)."""
    return fact_ratio([l, a - 1, n - a, n - l - 1], [x, n - 1, l - x, a - x - 1, n - a - l + x])


def paper_R(n, a, l, x):
    """R(x) exactly as printed under Theorem 1 (s counts the other-cluster candidates)."""
    pre = fact_ratio([l, n - l - 1], [n - 1])
    return pre * sum((fact_ratio([a - 1, n - a], [s, l - s, n - a - s, a - l + s - 1]) for s in range(l - x + 1)),
                     Fraction(0))


@pytest.mark.parametrize("n,a,l", [(20, 10, 5), (100, 50, 10), (100, 25, 10), (9, 3, 4)])
def test_G_and_R_match_printed_formulas_and_scipy(n, a, l):
    # scipy imported where used: at module level every collecting worker pays for it
    from scipy.stats import hypergeom

    g = G(n, a, l)
    for x in range(l + 1):
        assert g[x] == paper_G(n, a, l, x)
        assert abs(float(g[x]) - hypergeom(n - 1, a - 1, l).pmf(x)) < 1e-12
    for x in range(1, l + 1):
        assert R(n, a, l, x) == paper_R(n, a, l, x)
        assert abs(float(R(n, a, l, x)) - hypergeom(n - 1, a - 1, l).sf(x - 1)) < 1e-12


def brute_force_ball_model(n, a, l, k, rounds):
    """Appendix A.1, question (2): Pr(white balls summed over t draws >= k), by enumeration."""
    whites = set(range(a - 1))
    subsets = list(itertools.combinations(range(n - 1), l))
    out = []
    for t in range(1, rounds + 1):
        hits = sum(1 for seq in itertools.product(subsets, repeat=t)
                   if sum(len(whites.intersection(s)) for s in seq) >= k)
        out.append(Fraction(hits, len(subsets) ** t))
    return out


def brute_force_cni(n, a, l, k, rounds):
    """CNI itself under Assumption 1, by enumeration of every candidate sequence:
    returns Pr(all k neighbours same-cluster) and E[#same-cluster] per round."""
    rank = lambda j: (j >= a - 1, j)  # noqa: E731  (peers 0..a-2 are same-cluster and rank first)
    subsets = list(itertools.combinations(range(n - 1), l))
    all_same = [Fraction(0)] * rounds
    mean_same = [Fraction(0)] * rounds
    weight = Fraction(1, len(subsets) ** rounds)
    for seq in itertools.product(subsets, repeat=rounds):
        nb = set()
        for t, cand in enumerate(seq):
            nb = set(sorted(nb | set(cand), key=rank)[:k])
            same = sum(1 for j in nb if j < a - 1)
            all_same[t] += weight * (same == k)
            mean_same[t] += weight * Fraction(same, k)
    return all_same, mean_same


@pytest.mark.parametrize("n,a,l,k,rounds", SMALL)
def test_theorem_recursion_equals_ball_model_enumeration(n, a, l, k, rounds):
    got = cni_probabilities(n, a, l, k, rounds)
    want = brute_force_ball_model(n, a, l, k, rounds)
    assert got == pytest.approx([float(w) for w in want], abs=1e-12)


@pytest.mark.parametrize("n,a,l,k,rounds", SMALL)
def test_exact_chain_equals_cni_enumeration(n, a, l, k, rounds):
    all_same, mean_same = brute_force_cni(n, a, l, k, rounds)
    assert cni_probabilities_exact(n, a, l, k, rounds) == pytest.approx([float(x) for x in all_same], abs=1e-12)
    assert cni_expected_precision_exact(n, a, l, k, rounds) == pytest.approx([float(x) for x in mean_same],
                                                                             abs=1e-12)
    for dist in cni_distribution_exact(n, a, l, k, rounds):
        assert sum(dist) == pytest.approx(1.0, abs=1e-12)


def test_round_one_and_pens_equal_R_and_curve_increases():
    """P^1 = R(k) for both (Eq. 10, 11); Corollary 1: CNI's P^t rises."""
    from scipy.stats import hypergeom

    n, a, l, k = 100, 50, 10, 5
    p = cni_probabilities(n, a, l, k, 6)
    e = cni_probabilities_exact(n, a, l, k, 6)
    r = hypergeom(n - 1, a - 1, l).sf(k - 1)
    assert p[0] == pytest.approx(r, abs=1e-12) and e[0] == pytest.approx(r, abs=1e-12)
    assert pens_probability(n, a, l, k) == pytest.approx(r, abs=1e-12)
    assert all(x < y for x, y in zip(p, p[1:4]))
    assert all(x <= y for x, y in zip(e, e[1:]))
    assert all(x <= y + 1e-15 for x, y in zip(e, p))      # the paper's recursion never undercounts


def test_monte_carlo_of_the_cni_code_matches_the_exact_chain():
    """Run the real CNI functions with a perfect similarity; n=20 in 4 clusters of 5."""
    n, a, l, k, rounds, seeds = 20, 5, 5, 3, 4, 150
    ids = torch.arange(n)
    clusters = ids // a
    self_mask = torch.eye(n, dtype=torch.bool)
    same = (clusters[:, None] == clusters[None, :]) & ~self_mask
    sim = same.to(torch.float32) - ids[None, :] * 1e-3     # same-cluster first, then by index
    hits = torch.zeros(rounds)
    for seed in range(seeds):
        nb = None
        for t in range(1, rounds + 1):
            nb = cni_step(sim, draw_candidates(seed, t, ids, n, l), nb, k)
            hits[t - 1] += ((nb & same).sum(1) == k).sum()
    freq = (hits / (seeds * n)).tolist()
    exact = cni_probabilities_exact(n, a, l, k, rounds)
    paper = cni_probabilities(n, a, l, k, rounds)
    assert freq == pytest.approx(exact, abs=0.035)
    assert abs(freq[2] - exact[2]) < abs(freq[2] - paper[2])   # here the paper's count is visibly off


def test_cli(capsys):
    assert main(["cni", "--n", "100", "--a", "50", "--l", "10", "--k", "5", "--rounds", "4"]) == 0
    lines = capsys.readouterr().out.split()
    assert [float(x) for x in lines] == pytest.approx(cni_probabilities(100, 50, 10, 5, 4), abs=1e-11)
    assert main(["cni", "--n", "20", "--a", "5", "--l", "5", "--k", "3", "--rounds", "3", "--json", "--exact"]) == 0
    assert json.loads(capsys.readouterr().out) == cni_probabilities_exact(20, 5, 5, 3, 3)
    assert main(["cni", "--n", "20", "--a", "0", "--l", "5", "--k", "3", "--rounds", "3"]) == 2
    assert "--a" in capsys.readouterr().err


def test_bad_arguments_name_the_field():
    for args, field in [((1, 1, 1, 1, 1), "--n"), ((10, 11, 2, 1, 1), "--a"), ((10, 5, 10, 1, 1), "--l"),
                        ((10, 5, 3, 0, 1), "--k"), ((10, 5, 3, 2, 0), "--rounds")]:
        with pytest.raises(ConfigError) as info:
            cni_probabilities(*args)
        assert info.value.field == field


def test_fewer_candidates_than_neighbours_is_refused(capsys):
    """l < k: round 1 holds l < k neighbours, so P^1(k) = 0 would be printed as if it were a result
    (PANM and PENS refuse algorithm.l < algorithm.k the same way)."""
    for fn in (cni_probabilities, cni_probabilities_exact, cni_distribution_exact):
        with pytest.raises(ConfigError) as info:
            fn(20, 10, 3, 5, 3)
        assert info.value.field == "--l" and info.value.value == 3 and "--k" in info.value.fix
    with pytest.raises(ConfigError) as info:
        pens_probability(20, 10, 3, 5)
    assert info.value.field == "--l"
    assert main(["cni", "--n", "20", "--a", "10", "--l", "3", "--k", "5", "--rounds", "1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "'--l' = 3" in captured.err and "at least k" in captured.err
    # l = k is the boundary: every candidate is kept, so P^1(k) = R(k) = Pr(all 3 of 3 candidates same-cluster)
    assert cni_probabilities(20, 10, 3, 3, 1) == pytest.approx([math.comb(9, 3) / math.comb(19, 3)], abs=1e-15)
