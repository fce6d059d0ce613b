"""Whom each client averaged with over rounds 1-100 of experiments/dac_mixing.sh's runs (neighbors.npz's stage-one
count lists, stage1_rounds=100), and the second eigenvalue of the mean round's averaging matrix within each cluster
(the smaller, the faster a cluster's models mix).

    python3 experiments/dac_mixing.py OUT NAME [NAME ...]
"""
import json
import sys

import numpy as np

out = sys.argv[1]
for name in sys.argv[2:]:
    z = np.load(f"{out}/{name}/neighbors.npz")
    peers, counts, cl = z["stage1_peers"], z["stage1_counts"].astype(float), z["clusters"]
    n, R = len(cl), 100
    C = np.zeros((n, n))
    for i in range(n):
        ok = peers[i] >= 0
        C[i, peers[i][ok]] = counts[i][ok]
    tot = C.sum(1)
    top5 = np.sort(C, 1)[:, ::-1][:, :5].sum(1) / tot
    same = np.array([C[i, cl == cl[i]].sum() / tot[i] for i in range(n)])
    k = tot.mean() / R
    M = (np.eye(n) + C / R) / (1 + k)       # the mean round's averaging matrix
    lam = []
    for c in np.unique(cl):
        idx = np.flatnonzero(cl == c)
        ev = np.sort(np.abs(np.linalg.eigvals(M[np.ix_(idx, idx)])))[::-1]
        lam.append(ev[1])
    s = json.load(open(f"{out}/{name}/summary.json"))
    print(f"{name}: accuracy {s['final_accuracy']:.2f}; distinct peers {(C > 0).sum(1).mean():.1f} "
          f"(min {(C > 0).sum(1).min()}, max {(C > 0).sum(1).max()}); share of pulls to the 5 most pulled "
          f"{top5.mean():.2f}; same-cluster share {same.mean():.3f}; |lambda_2| of the mean averaging matrix within "
          f"each cluster {', '.join(f'{x:.3f}' for x in lam)}")
