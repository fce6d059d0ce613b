"""The round's one gather, as every algorithm sees it: every client's
training loss (``view.all_loss``) and flags, the labels an algorithm gathers, and the models
after (and, for some, before) local training, whole in the same collective
or in column blocks as the algorithm reads them (config ``exchange_mb``).
The algorithm gets a :class:`fedclust.algorithms.base.RoundView` and reads
the models through :meth:`~fedclust.algorithms.base.RoundView.blocks`."""

from __future__ import annotations

import torch

from fedclust.algorithms.base import RoundView
from fedclust.dist import ColumnBlocks
from fedclust.rank import Shard

LABEL_LIMIT = 2**24   # RoundPlan.labels travel as float32 in the round's gather: exact below this



def plan_labels(algo, plan) -> torch.Tensor:
    """The plan's labels as the gather carries them: integers in [0, 2^24), exact in float32."""
    labels = plan.labels
    if labels is None or (labels.numel() and not 0 <= int(labels.min()) <= int(labels.max()) < LABEL_LIMIT):
        raise ValueError(f"{algo.name} declares gathers_labels: its plan must give labels, integers in [0, 2^24) "
                         "(float32 carries them exactly)")
    return labels


def exchange(shard: Shard, columns: int, t: int, flat, before, train_loss, flags, labels=None):
    """The round's gather on this rank's ``shard``: (view, every client's training loss, every client's flags);
    ``labels`` [C] go as one more column, to ``view.all_labels``.  Whole models in one collective, or (``columns``
    > 0, config exchange_mb) the losses, flags and labels in one and the models in column blocks of ``columns``
    as the algorithm reads them (:class:`fedclust.dist.ColumnBlocks`)."""
    small = [train_loss[:, None].to(flat.dtype), flags]
    if labels is not None:
        small.append(labels.to(device=flat.device, dtype=flat.dtype)[:, None])
    if columns:
        got = shard.gather_parts(t, small)
        parts = {"after": flat} if before is None else {"after": flat, "before": before}
        blocks = ColumnBlocks(shard.fabric, parts, shard.n, columns,
                              collective=lambda fn, *a: shard.collective(t, fn, *a))
        view = RoundView(round=t, before=before, after=flat, columns=blocks)
    else:
        whole = [flat, *small] + ([] if before is None else [before])
        got = shard.gather_parts(t, whole)
        view = RoundView(round=t, before=before, after=flat, all_after=got[0],
                         all_before=got[-1] if before is not None else None)
        got = got[1:1 + len(small)]
    loss = got[0][:, 0]
    view.all_loss = loss.clone()   # the peers' reported losses, the algorithm's own copy (view.all_loss)
    if labels is not None:
        view.all_labels = got[2][:, 0].to(torch.int64)
    return view, loss, got[1][:, 0]
