"""The plain path of docs/algorithms.md: one ``nn.Module`` and one ``torch.optim.SGD``
per client, trained one client after the other on the same batches as
:func:`fedclust.engine.train.train_round`.

The engine's tests check the vectorized engine against it, and
``fedclust bench`` times it as the speed baseline; the product never
imports it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedclust.engine.layout import ParamLayout
from fedclust.engine.train import TrainSettings
from fedclust.models import build_model


def reference_train_round(flat: torch.Tensor, layout: ParamLayout, arch: str, x: torch.Tensor, y: torch.Tensor,
                          orders: torch.Tensor, settings: TrainSettings, input_shape: tuple[int, ...],
                          num_classes: int, anchor: torch.Tensor | None = None, mu: float = 0.0,
                          phases=None) -> torch.Tensor:
    """Train each client's row of ``flat`` [C, P] in place with its own module
    and optimizer, minimising the batch cross-entropy plus, with an
    ``anchor`` ([P] or [C, P]), ``mu/2 ||w - anchor||^2``; returns each
    client's mean batch cross-entropy over the round [C].  ``settings.max_steps``: each client stops after
    that many steps (a straggler).  ``phases`` (``((epochs, tensor names), ...)``): in each phase the named
    tensors are put back to their values at the phase's start after every step (one optimizer throughout), as
    DePRL's code freezes its body, then its head."""
    model = build_model(arch, input_shape, num_classes).to(device=flat.device, dtype=flat.dtype)
    n, bs = x.shape[1], settings.batch_size
    losses = torch.empty(flat.shape[0], dtype=flat.dtype, device=flat.device)
    for c in range(flat.shape[0]):
        layout.load_into(model, flat[c])
        centre = None if anchor is None or mu == 0 else (anchor if anchor.dim() == 1 else anchor[c])
        opt = torch.optim.SGD(model.parameters(), lr=settings.lr, momentum=settings.momentum,
                              dampening=0, nesterov=False, weight_decay=0)
        total, steps = torch.zeros((), dtype=flat.dtype, device=flat.device), 0
        frozen_at = [] if phases is None else [set(layout.names[k] for k in layout.select(names)) if names else set()
                                               for count, names in phases for _ in range(count)]
        for epoch in range(orders.shape[0]):
            order = orders[epoch, c].to(x.device)
            frozen = frozen_at[epoch] if frozen_at else set()
            if frozen and (epoch == 0 or frozen_at[epoch - 1] != frozen):   # a phase starts: what it keeps
                kept = {name: p.detach().clone() for name, p in model.named_parameters() if name in frozen}
            for start in range(0, n, bs):
                if settings.max_steps and steps == settings.max_steps:   # a straggler stops here
                    break
                idx = order[start:start + bs]
                loss = F.cross_entropy(model(x[c, idx]), y[c, idx].to(x.device))
                objective = loss
                if centre is not None:
                    w = torch.cat([p.reshape(-1) for p in model.parameters()])
                    objective = loss + 0.5 * mu * (w - centre).pow(2).sum()
                opt.zero_grad(set_to_none=True)
                objective.backward()
                opt.step()
                if frozen:
                    with torch.no_grad():
                        for name, p in model.named_parameters():
                            if name in frozen:
                                p.copy_(kept[name])
                total += loss.detach()
                steps += 1
        losses[c] = total / steps
        flat[c] = layout.flatten(model)
    return losses
