"""Record PANM's HNM inputs every stage-two round, to find why a client's
list takes a wrong peer (issue: PANM keeps its clusters).

    python experiments/probe_hnm.py OUT.npz configs/fmnist_rotation2.yaml KEY=VALUE ...

Runs ``fedclust run`` in one process with PANM's stage two wrapped: for every
HNM round it stores the neighbour lists before and after, the candidates C,
the sample S, the values y the EM saw, the EM's high component, and (PANMGrad)
the two cosine terms of the similarity separately.  Writes OUT.npz (arrays
stacked over rounds) every 10 rounds and at the end.
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from fedclust.algorithms import hnm, panm
from fedclust.algorithms.similarity import grad_similarity
from fedclust.config import load_config
from fedclust.runner import prepare, run


def main(argv):
    path, config, overrides = argv[0], argv[1], argv[2:]
    cfg = load_config(config, overrides)
    rec: dict[str, list] = {}
    orig_stage_two, orig_update = panm.PANM._stage_two, panm.hnm_update
    current = {}

    def update(neighbors, cand, sample, similarity, **kw):
        new, failed = orig_update(neighbors, cand, sample, similarity, **kw)
        if not isinstance(similarity, torch.Tensor):   # PoolScores: the values on the pool, NaN elsewhere
            similarity = similarity.matrix(neighbors.shape[1])
        current.update(before=neighbors.cpu().numpy(), after=new.cpu().numpy(), cand=cand.cpu().numpy(),
                       sample=sample.cpu().numpy(), y=similarity.float().cpu().numpy(), failed=failed.cpu().numpy())
        return new, failed

    def stage_two(self, state, ctx, view):
        current.clear()
        out = orig_stage_two(self, state, ctx, view)
        if current:
            current["round"] = np.array(view.round)
            if self.metric == "grad":
                w0 = ctx.w0.to(view.after.device)
                for name, a in (("cos_update", 1.0), ("cos_total", 0.0)):
                    current[name] = grad_similarity(view.all_after, view.all_before, w0, a,
                                                    own=ctx.own_rows).float().cpu().numpy()
            for key, v in current.items():
                rec.setdefault(key, []).append(np.asarray(v))
            if view.round % 10 == 0:
                save()
        return out

    def save():
        np.savez_compressed(path, clusters=np.asarray(saved_clusters[0]),
                            **{k: np.stack(v) for k, v in rec.items()})

    saved_clusters = []
    orig_init = panm.PANM.init

    def init(self, ctx):
        saved_clusters.append(ctx.clusters.cpu().numpy())
        return orig_init(self, ctx)

    panm.PANM._stage_two, panm.hnm_update, panm.PANM.init = stage_two, update, init
    run(cfg, prepare(cfg))
    save()


if __name__ == "__main__":
    main(sys.argv[1:])
