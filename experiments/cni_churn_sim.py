"""Issue 46, part 3: an idealised simulation of PANM's stage one (CNI) under churn, without fedclust.

Assumption 1 holds exactly: a client scores its own cluster above the cluster rotated 180 degrees from it, and that
above the quarter turns (levels 2, 1, 0, plus uniform noise of 0.5). n = 100 clients in 4 clusters of 25, k = 5,
l = 10, T1 = 100 rounds, each client offline with probability p each round.  Two rules for a previous neighbour
that does not answer (offline):

- drop (fedclust's `_stage_one` today): the pool is the answering part of C_i ∪ N_i^{t-1}, and the top k of it
  fill the list, so the silent neighbour's slot goes to the best answer;
- keep (Eq. 8's carrying of N_i^{t-1}): a silent previous neighbour keeps its slot, the top k - kept of the answers
  fill the rest.

Prints, for 2 seeds, the averagings with another cluster in stage one (and of them with the 180-degree cluster),
and the clients whose list holds another cluster's client at T1.

    python3 experiments/cni_churn_sim.py
"""
import numpy as np

n, K, L, T1 = 100, 5, 10, 100
cl = np.arange(n) // 25            # 0: 0 deg, 1: 90, 2: 180, 3: 270
opp = (cl + 2) % 4


def level(i, j):
    """2: own cluster, 1: the cluster rotated 180 degrees, 0: a quarter turn."""
    return np.where(cl[j] == cl[i], 2, np.where(cl[j] == opp[i], 1, 0))


def run(p, rule, seed):
    rng = np.random.default_rng(seed)
    lists = [set() for _ in range(n)]
    wrong, wrong180 = 0, 0
    for _ in range(T1):
        online = rng.random(n) >= p
        new = []
        for i in range(n):
            if not online[i]:          # an offline client keeps its list and averages with no one
                new.append(lists[i])
                continue
            cand = set(rng.choice(np.delete(np.arange(n), i), L, replace=False).tolist())
            pool = [j for j in cand | lists[i] if online[j]]
            kept = [j for j in lists[i] if not online[j]] if rule == "keep" else []
            score = level(i, np.array(pool, dtype=int)) + rng.random(len(pool)) * 0.5 if pool else np.array([])
            top = [pool[x] for x in np.argsort(-score)[:max(0, K - len(kept))]]
            new.append(set(top) | set(kept))
            wrong += int(sum(cl[j] != cl[i] for j in top))     # averaged with this round (they answered)
            wrong180 += int(sum(cl[j] == opp[i] for j in top))
        lists = new
    bad = sum(any(cl[j] != cl[i] for j in lists[i]) for i in range(n))
    return wrong, wrong180, bad


if __name__ == "__main__":
    for p in (0.1, 0.3, 0.5):
        for rule in ("drop", "keep"):
            r = [run(p, rule, s) for s in range(2)]
            print(f"p_offline {p} {rule}: wrong averagings in stage one {[x[0] for x in r]} "
                  f"(180 degrees: {[x[1] for x in r]}); clients with a wrong entry at T1 {[x[2] for x in r]}")
