"""Measurement tools, kept apart from the product they measure.

- :mod:`.local`: ``fedclust bench``, one round of local training, the
  vectorized engine against the plain per-client loop;
- :mod:`.rounds`: ``fedclust bench-rounds``, whole-round time of algorithms
  side by side (and ``--checkpoint``, the cost of one checkpoint);
- :mod:`.scale`: ``fedclust bench-scale``, round time, gather and memory
  against the number of clients;
- :mod:`.reference`: the plain per-client training loop (one ``nn.Module``
  and one ``torch.optim.SGD`` per client) that the engine's tests and
  ``fedclust bench`` compare the vectorized engine with.

This package is a top layer, beside the CLI: it imports the product
(runner, engine, algorithms, data, ...) through public functions only, and
nothing in the product imports it (tests/unit/test_plugins.py checks both).
"""
