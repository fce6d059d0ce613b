"""Vectorized training engine: many clients' models as rows of one flat
``[C, P]`` buffer (:mod:`.layout`), functional forwards of the docs/algorithms.md
models (:mod:`.functional`), local SGD, evaluation and cross-model losses
for all clients at once (:mod:`.train`, :mod:`.pool`).  The plain per-client
loop they are checked against is :mod:`fedclust.bench.reference`."""

from fedclust.engine.layout import ParamLayout
from fedclust.engine.pool import pool_losses
from fedclust.engine.train import TrainSettings, evaluate, pair_losses, train_round

__all__ = ["ParamLayout", "TrainSettings", "evaluate", "pair_losses", "pool_losses", "train_round"]
