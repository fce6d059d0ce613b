"""The Synthetic data of FPFC's official code (xueyu-ubc/FPFC, Synthetic/data/generate_synthetic_dataset.py),
rewritten, as a fedclust npz file in the natural form (data.name=npz data.path=FILE): m devices in K clusters
(contiguous blocks), per cluster u ~ N(0, 1), W ~ N(u, 1) [classes, dim], b ~ N(u, 1) [classes]; device i has
(lognormal(4, 2) + 50)*5 samples (int), x ~ U[0, 1)^dim, y = argmax(W x + b + N(0, 0.5^2)); 80% train, 20% test.
Usage: python experiments/fpfc_official_synthetic_data.py OUT.npz [seed] [devices] [clusters]; then
fedclust run configs/fpfc_official_synthetic.yaml data.name=npz data.path=OUT.npz train.batch_size=20000"""
import sys

import numpy as np

out = sys.argv[1]
seed = int(sys.argv[2]) if len(sys.argv) > 2 else 1
m = int(sys.argv[3]) if len(sys.argv) > 3 else 100
K = int(sys.argv[4]) if len(sys.argv) > 4 else 4
dim, classes = 60, 10
rs = np.random.RandomState(seed)
samples = ((rs.lognormal(4, 2, m).astype(int) + 50) * 5).astype(int)
cluster = np.arange(m) // (m // K)
u = rs.normal(0, 1, K)
W = [rs.normal(u[k], 1, (classes, dim)).astype(np.float32) for k in range(K)]
b = [rs.normal(u[k], 1, (1, classes)).astype(np.float32) for k in range(K)]
xs_tr, ys_tr, cs_tr, xs_te, ys_te, cs_te = [], [], [], [], [], []
for i in range(m):
    n = samples[i]
    x = rs.random_sample((n, dim))
    logits = x @ W[cluster[i]].T + b[cluster[i]] + rs.normal(0, 0.5, (n, classes))
    y = logits.argmax(1)
    perm = rs.permutation(n)
    ntr = int(round(0.8 * n))
    tr, te = perm[:ntr], perm[ntr:]
    xs_tr.append(x[tr]); ys_tr.append(y[tr]); cs_tr.append(np.full(len(tr), i))
    xs_te.append(x[te]); ys_te.append(y[te]); cs_te.append(np.full(len(te), i))
np.savez(out, x_train=np.concatenate(xs_tr).astype(np.float32), y_train=np.concatenate(ys_tr).astype(np.int64),
         client_train=np.concatenate(cs_tr).astype(np.int64), x_test=np.concatenate(xs_te).astype(np.float32),
         y_test=np.concatenate(ys_te).astype(np.int64), client_test=np.concatenate(cs_te).astype(np.int64),
         cluster=cluster.astype(np.int64), num_classes=np.int64(classes))
print(f"{out}: {m} devices, samples a device min {samples.min()} median {int(np.median(samples))} "
      f"max {samples.max()} total {samples.sum()}")
