"""Vectorized local training and evaluation of many clients (docs/algorithms.md).

The C clients of a process are the rows of one flat buffer ``[C, P]``
(:class:`~fedclust.engine.layout.ParamLayout`); every step trains all
clients of a chunk at once, SGD with momentum updating per-layer views of
the buffer in place.  Two ways to get the gradients, equal up to rounding
(tests check both against the per-client ``torch.optim.SGD`` loop):

- ``torch.func.grad`` of the sum of the per-client losses over the batched
  forward (:func:`~fedclust.engine.functional.batched_forward_fn`): clients
  share no parameters, so the gradient of the sum is each client's own
  gradient, exactly ``vmap(grad(loss))``.  Used for the CNN (and for the MLP
  with ``backprop="func"`` or ``compile=True``).  Memory: weights, gradients
  and momentum, 3 x ``[C, P]``; the fresh gradients become the next momentum.
- For the MLP and logistic regression (an MLP with no hidden layer), a
  hand-written batched backward
  (:func:`~fedclust.engine.functional.dense_momentum_grads_`) whose weight
  gradients are accumulated by ``baddbmm_`` straight into the momentum
  buffer: 2 x ``[C, P]``, no per-step ``[C, P]`` temporaries and no
  ``torch.func`` dispatch (1.3 ms per step on the host), which is what makes
  the MLP round clearly faster than the plain loop on a CPU and gives a GPU
  step fewer kernel launches.

Clients are processed in chunks only to bound memory and, on a CPU, to keep
each step's tensors cache-sized; within a chunk there is no Python loop over
clients, and no host synchronisation in the step loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import islice

import torch
import torch.nn.functional as F
from torch.func import grad

from fedclust.engine.functional import (
    batched_forward_fn,
    dense_momentum_grads_,
    evaluating,
    per_client_cross_entropy,
)
from fedclust.engine.layout import ParamLayout
from fedclust.engine.memory import Inputs, eval_chunk_sizes, train_chunk_size
from fedclust.engine.module_net import ModuleNet
from fedclust.engine.net import Arch, as_net


@dataclass
class TrainSettings:
    """Local SGD of one round (docs/algorithms.md)."""

    lr: float
    momentum: float = 0.9
    batch_size: int = 128
    epochs: int = 3
    client_chunk: int = 0  # clients trained at once; 0 = automatic (see train_chunk_size)
    backprop: str = "auto"  # auto: hand-written for mlp/logreg, torch.func otherwise | func: torch.func always
    compile: bool = False  # torch.compile the torch.func gradient step (meant for GPUs; implies func)
    max_steps: int = 0     # a straggler's round: it stops after this many SGD steps (0: every step of its epochs)

    def __post_init__(self):
        """Guards of the engine's API; a run's values come from the ``train``
        section, checked with the config (:func:`fedclust.schema.validate_core`)."""
        if not self.lr > 0:
            raise ValueError(f"TrainSettings.lr = {self.lr!r}: use a positive learning rate")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"TrainSettings.momentum = {self.momentum!r}: use a momentum in [0, 1)")
        if self.batch_size < 1 or self.epochs < 1:
            raise ValueError(f"TrainSettings.batch_size = {self.batch_size!r}, epochs = {self.epochs!r}: "
                             "use at least 1 of each")
        if self.backprop not in ("auto", "func"):
            raise ValueError(f"TrainSettings.backprop = {self.backprop!r}: use 'auto' or 'func'")
        if self.max_steps < 0:
            raise ValueError(f"TrainSettings.max_steps = {self.max_steps!r}: use 0 (every step) or a positive count")
        if self.client_chunk < 0:
            raise ValueError(f"TrainSettings.client_chunk = {self.client_chunk!r}: use 0 (automatic) or a "
                             "positive count")


def _check_data(flat: torch.Tensor, layout: ParamLayout, x: Inputs, y: torch.Tensor) -> None:
    if flat.dim() != 2 or flat.shape[1] != layout.numel:
        raise ValueError(f"flat must be [C, P={layout.numel}], got shape {tuple(flat.shape)}")
    if y.dim() != 2 or x.shape[:2] != y.shape:
        raise ValueError(f"x must be [C, N, *input] and y [C, N] with the same C and N, "
                         f"got x {tuple(x.shape)} and y {tuple(y.shape)}")
    if x.shape[0] != flat.shape[0]:
        raise ValueError(f"x holds {x.shape[0]} clients but flat holds {flat.shape[0]}; pass one row per client")
    if x.shape[1] < 1:
        raise ValueError("x holds no samples (N = 0); every client needs at least one")
    if x.device != flat.device or x.dtype != flat.dtype:
        raise ValueError(f"x ({x.dtype} on {x.device}) and flat ({flat.dtype} on {flat.device}) must share "
                         "dtype and device; move the data with .to(flat)")


def _make_grad_fn(arch: Arch, weighted: bool = False):
    """(params {name: [C, *shape]}, x [C, B, ...], y [C, B]) -> (grads, losses [C]);
    ``weighted``: a fourth argument w [C, B] weights each sample's
    cross-entropy (a client's loss is ``sum_i w_i ce_i``)."""
    forward = batched_forward_fn(arch)

    def total_loss(params, xb, yb):
        losses = per_client_cross_entropy(forward(params, xb), yb)
        return losses.sum(), losses.detach()

    def total_weighted_loss(params, xb, yb, w):
        logits = forward(params, xb)
        c, b, k = logits.shape
        ce = F.cross_entropy(logits.reshape(c * b, k), yb.reshape(c * b), reduction="none").view(c, b)
        losses = (ce * w).sum(1)
        return losses.sum(), losses.detach()

    return grad(total_weighted_loss if weighted else total_loss, has_aux=True)


_GRAD_FNS: dict[tuple, object] = {}


def _grad_fn(arch: Arch, compiled: bool = False, weighted: bool = False):
    """The cached gradient step of ``arch``, optionally ``torch.compile``d."""
    key = (arch, compiled, weighted)
    if key not in _GRAD_FNS:
        fn = _make_grad_fn(arch, weighted)
        _GRAD_FNS[key] = torch.compile(fn, dynamic=False) if compiled else fn
    return _GRAD_FNS[key]


def sgd_momentum_(params: list[torch.Tensor], grads: list[torch.Tensor], bufs: list[torch.Tensor] | None,
                  lr: float, momentum: float, frozen: tuple[int, ...] = ()) -> list[torch.Tensor]:
    """One step of ``torch.optim.SGD`` (dampening 0, no Nesterov, no weight
    decay) in place on ``params``: ``buf ← momentum·buf + g``, ``w ← w − lr·buf``.

    ``bufs`` is the previous step's momentum (None on the first step of a
    round: the buffer starts at zero, so ``buf = g`` as in torch).  The new
    momentum is written into the fresh ``grads`` tensors, which are returned
    as the next step's ``bufs``: two passes over memory instead of three.
    ``frozen``: indices of tensors not updated (a training phase that freezes
    them, as ``torch.optim.SGD`` with those tensors restored after each step).
    """
    if bufs is not None and momentum != 0:
        torch._foreach_add_(grads, bufs, alpha=momentum)
    if frozen:   # tensors of a frozen phase keep their values; their momentum builds all the same
        moving = [k for k in range(len(params)) if k not in frozen]
        torch._foreach_add_([params[k] for k in moving], [grads[k] for k in moving], alpha=-lr)
    else:
        torch._foreach_add_(params, grads, alpha=-lr)
    return grads


def _limit(settings: TrainSettings) -> int | None:
    """The steps a round's training takes at most (``islice``'s stop): ``max_steps``, None for all."""
    return settings.max_steps or None


def _batches(x: torch.Tensor, y: torch.Tensor, orders: torch.Tensor, batch_size: int,
             rows: torch.Tensor | None = None):
    """The round's batches (x [C, b, ...], y [C, b]): consecutive slices of
    each epoch's per-client order (docs/algorithms.md), gathered for all clients at once."""
    rows = (torch.arange(x.shape[0], device=x.device) if rows is None else rows).unsqueeze(1)
    for epoch in range(orders.shape[0]):
        for start in range(0, orders.shape[2], batch_size):
            idx = orders[epoch, :, start:start + batch_size]
            yield x[rows, idx], y[rows, idx]


def _masked_batches(x: torch.Tensor, y: torch.Tensor, orders: torch.Tensor, batch_size: int, counts: torch.Tensor,
                    frozen: tuple[tuple[int, ...], ...] | None = None):
    """:func:`_batches` for clients holding ``counts[c]`` real examples of the
    N positions: also each sample's weight w [C, b] (1 / the client's real
    batch size on its real samples, 0 on padding), which clients have a
    batch at this step, active [C], and the tensors frozen at the step."""
    counts = counts.to(x.device)
    longest = int(counts.max()) if len(counts) else 0   # batches from here on hold no client's examples: no-op steps
    steps = zip(_batches(x, y, orders, batch_size), _starts(orders.shape[0], x.shape[1], batch_size),
                _step_frozen(frozen, x.shape[1], batch_size))
    for (xb, yb), start, off in steps:
        if start >= longest:
            continue
        pos = torch.arange(start, start + yb.shape[1], device=x.device)
        valid = pos[None, :] < counts[:, None]
        size = valid.sum(1)
        yield xb, yb, valid.to(x.dtype) / size.clamp_min(1)[:, None].to(x.dtype), size > 0, off


def _starts(epochs: int, n: int, batch_size: int):
    for _ in range(epochs):
        yield from range(0, n, batch_size)


def _step_frozen(frozen: tuple[tuple[int, ...], ...] | None, n: int, batch_size: int):
    """The tensors frozen at each step of :func:`_batches` (epoch by epoch): ``frozen[epoch]``, or () throughout."""
    if frozen is None:
        while True:
            yield ()
    for off in frozen:
        for _ in range(0, n, batch_size):
            yield off


def frozen_epochs(layout: ParamLayout, phases, epochs: int) -> tuple[tuple[int, ...], ...] | None:
    """``phases`` (``((epochs, tensor names), ...)``, names as :meth:`ParamLayout.select` takes them) as the
    tensor indices frozen in each epoch; None for no phases.  Their epochs must sum to ``epochs``."""
    if phases is None:
        return None
    out: list[tuple[int, ...]] = []
    for count, names in phases:
        if count < 1:
            raise ValueError(f"phases = {phases!r}: every phase needs at least one epoch")
        idx = layout.select(names) if names else ()
        out.extend([idx] * count)
    if len(out) != epochs:
        raise ValueError(f"phases = {phases!r} hold {len(out)} epochs but settings.epochs = {epochs}")
    return tuple(out)


def proximal_layers(layout: ParamLayout, names) -> tuple[int, ...] | None:
    """The indices in ``layout.names`` of the parameter tensors that carry
    the proximal term (``names``, e.g. FPFC's classifier head under
    ``fpfc.fuse=head``); None (every tensor) when ``names`` is None."""
    if names is None:
        return None
    names = tuple(names)
    unknown = [name for name in names if name not in layout.names]
    if unknown or not names:
        raise ValueError(f"prox_layers = {names!r}: must name at least one of the model's parameter tensors "
                         f"{layout.names} (unknown: {unknown}); pass None for the whole model")
    return tuple(k for k, name in enumerate(layout.names) if name in names)


def _add_proximal_(grads: list, params: list, anchors: list, mu: float, prox: tuple[int, ...] | None) -> None:
    """``g += mu * (w - anchor)`` per tensor, in place on ``grads``; only the
    tensors ``prox`` lists when it is given (None: all of them, the same two
    foreach calls on the same lists as before the selection existed)."""
    if prox is not None:
        grads, params, anchors = ([t[k] for k in prox] for t in (grads, params, anchors))
    torch._foreach_add_(grads, params, alpha=mu)
    torch._foreach_add_(grads, anchors, alpha=-mu)


def _train_chunk_masked(flat: torch.Tensor, layout: ParamLayout, arch: Arch, x: torch.Tensor, y: torch.Tensor,
                        orders: torch.Tensor, settings: TrainSettings, anchor: torch.Tensor | None, mu: float,
                        counts: torch.Tensor, prox: tuple[int, ...] | None = None,
                        frozen: tuple[tuple[int, ...], ...] | None = None) -> torch.Tensor:
    """:func:`_train_chunk_func` for clients of unequal sizes: all clients
    step together; a client without a batch at a step (its epoch has fewer
    batches) does not step: its weights and momentum stay as they are, as
    they would in its own per-client loop.  Returns mean losses [C] over
    each client's own steps."""
    grad_fn = _grad_fn(arch, settings.compile, weighted=True)
    params = layout.views(flat)
    param_list = list(params.values())
    anchors = list(layout.views(anchor).values()) if anchor is not None else None
    bufs = None
    loss_sum = torch.zeros(flat.shape[0], dtype=flat.dtype, device=flat.device)
    steps = torch.zeros_like(loss_sum)
    for xb, yb, w, active, off in islice(_masked_batches(x, y, orders, settings.batch_size, counts, frozen),
                                         _limit(settings)):
        grads, losses = grad_fn(params, xb, yb, w)
        grads = [grads[name] for name in layout.names]
        if anchors is not None:  # proximal term: g += mu * (w - anchor)
            _add_proximal_(grads, param_list, anchors, mu, prox)
        on = [active.view((-1,) + (1,) * (g.dim() - 1)) for g in grads]
        if bufs is None:
            bufs = grads                    # every client has a batch at its round's first step
        else:
            bufs = [torch.where(a, settings.momentum * b + g, b) for a, b, g in zip(on, bufs, grads)]
        with torch.no_grad():
            for k, (p, a, b) in enumerate(zip(param_list, on, bufs)):
                if k not in off:   # a frozen tensor keeps its values
                    p.sub_(torch.where(a, b, torch.zeros_like(b)), alpha=settings.lr)
        loss_sum += losses * active
        steps += active
    return loss_sum / steps.clamp_min(1)


def _train_chunk_func(flat: torch.Tensor, layout: ParamLayout, arch: Arch, x: torch.Tensor, y: torch.Tensor,
                      orders: torch.Tensor, settings: TrainSettings, anchor: torch.Tensor | None,
                      mu: float, prox: tuple[int, ...] | None = None,
                      frozen: tuple[tuple[int, ...], ...] | None = None) -> torch.Tensor:
    """Local training of all rows of ``flat`` with ``torch.func.grad``; returns mean losses [C]."""
    grad_fn = _grad_fn(arch, settings.compile)
    params = layout.views(flat)
    param_list = list(params.values())
    anchors = list(layout.views(anchor).values()) if anchor is not None else None
    bufs = None  # momentum, one tensor per layer [C, *shape]
    loss_sum = torch.zeros(flat.shape[0], dtype=flat.dtype, device=flat.device)
    steps = 0
    batches = zip(_batches(x, y, orders, settings.batch_size), _step_frozen(frozen, x.shape[1], settings.batch_size))
    for (xb, yb), off in islice(batches, _limit(settings)):
        grads, losses = grad_fn(params, xb, yb)
        grads = [grads[name] for name in layout.names]
        if anchors is not None:  # proximal term: g += mu * (w - anchor)
            _add_proximal_(grads, param_list, anchors, mu, prox)
        bufs = sgd_momentum_(param_list, grads, bufs, settings.lr, settings.momentum, off)
        loss_sum += losses
        steps += 1
    return loss_sum / steps


def _train_chunk_dense(flat: torch.Tensor, layout: ParamLayout, layers: tuple[str, ...], x: torch.Tensor,
                       y: torch.Tensor, orders: torch.Tensor, settings: TrainSettings,
                       anchor: torch.Tensor | None, mu: float, prox: tuple[int, ...] | None = None,
                       frozen: tuple[tuple[int, ...], ...] | None = None) -> torch.Tensor:
    """Local training of all rows of ``flat`` (MLP or logistic regression,
    ``layers`` of :data:`DENSE_LAYERS`) with the hand-written backward of
    :func:`dense_momentum_grads_`; returns mean losses [C]."""
    params = layout.views(flat)
    momentum = torch.zeros_like(flat)
    bufs = layout.views(momentum)
    loss_sum = torch.zeros(flat.shape[0], dtype=flat.dtype, device=flat.device)
    steps = 0
    moving: dict[tuple[int, ...], tuple[tuple[int, int], ...]] = {}   # the columns a phase updates
    batches = zip(_batches(x, y, orders, settings.batch_size), _step_frozen(frozen, x.shape[1], settings.batch_size))
    for (xb, yb), off in islice(batches, _limit(settings)):
        loss_sum += dense_momentum_grads_(params, bufs, xb, yb, settings.momentum if steps else 0.0, layers)
        if anchor is not None:
            if prox is None:   # proximal term: buf += mu * (w - anchor)
                momentum.add_(flat, alpha=mu).add_(anchor, alpha=-mu)
            else:              # on the selected tensors' columns only
                for k in prox:
                    cols = slice(layout.offsets[k], layout.offsets[k] + layout.sizes[k])
                    momentum[:, cols].add_(flat[:, cols], alpha=mu).add_(anchor[:, cols], alpha=-mu)
        if off:   # a frozen phase: only the other tensors' columns move
            if off not in moving:
                moving[off] = layout.column_ranges(k for k in range(len(layout.names)) if k not in off)
            for a, b in moving[off]:
                flat[:, a:b].add_(momentum[:, a:b], alpha=-settings.lr)
        else:
            flat.add_(momentum, alpha=-settings.lr)  # w <- w - lr * buf, torch.optim.SGD
        steps += 1
    return loss_sum / steps


def _train_chunk_loop(flat: torch.Tensor, layout: ParamLayout, net: ModuleNet, x: torch.Tensor, y: torch.Tensor,
                      orders: torch.Tensor, settings: TrainSettings, anchor: torch.Tensor | None,
                      mu: float, counts: torch.Tensor | None = None,
                      prox: tuple[int, ...] | None = None,
                      frozen: tuple[tuple[int, ...], ...] | None = None) -> torch.Tensor:
    """Local training of the rows of ``flat`` one client after another (the
    ``loop`` engine): the module holds client c's row, autograd gives the
    batch gradient, and the same SGD step as the batched paths updates it;
    returns mean losses [C]."""
    module = net.module_on(flat.device)
    params: list[torch.Tensor] = list(module.parameters())
    losses = torch.empty(flat.shape[0], dtype=flat.dtype, device=flat.device)
    rows = torch.arange(x.shape[0], device=x.device)
    for c in range(flat.shape[0]):
        with torch.no_grad():
            for p, v in zip(params, layout.views(flat[c]).values()):
                p.copy_(v)
        centre = list(layout.views(anchor[c]).values()) if anchor is not None else None
        bufs, total, steps = None, torch.zeros((), dtype=flat.dtype, device=flat.device), 0
        m = int(counts[c]) if counts is not None else x.shape[1]   # the client's own examples come first
        batches = zip(_batches(x[c:c + 1], y[c:c + 1], orders[:, c:c + 1, :m], settings.batch_size, rows[:1]),
                      _step_frozen(frozen, m, settings.batch_size))
        for (xb, yb), off in islice(batches, _limit(settings)):
            loss = F.cross_entropy(module(xb[0]), yb[0])
            grads = list(torch.autograd.grad(loss, params))
            with torch.no_grad():
                if centre is not None:   # proximal term: g += mu * (w - anchor)
                    _add_proximal_(grads, params, centre, mu, prox)
                bufs = sgd_momentum_(params, grads, bufs, settings.lr, settings.momentum, off)
            total += loss.detach()
            steps += 1
        losses[c] = total / steps
        with torch.no_grad():
            flat[c] = torch.cat([p.reshape(-1) for p in params])
    return losses


def _train_chunk(flat: torch.Tensor, layout: ParamLayout, arch: Arch, x: torch.Tensor, y: torch.Tensor,
                 orders: torch.Tensor, settings: TrainSettings, anchor: torch.Tensor | None,
                 mu: float, counts: torch.Tensor | None = None, prox: tuple[int, ...] | None = None,
                 frozen: tuple[tuple[int, ...], ...] | None = None) -> torch.Tensor:
    """One chunk of clients trained at once, by the one of the four chunk trainers that fits the model and the
    data, chosen here and nowhere else: ``loop`` (a ModuleNet of engine "loop": one client after another,
    ``torch.optim.SGD``-exact), ``masked`` (clients of unequal sizes: torch.func with per-sample weights and
    per-client steps), ``dense`` (the MLP and logistic regression: the hand-written batched backward) or
    ``func`` (any other: ``torch.func.grad`` of the batched forward)."""
    net = as_net(arch)
    if net.engine == "loop":
        if not isinstance(net, ModuleNet):
            raise TypeError(f"model {net.name!r} declares engine 'loop', which trains an nn.Module one client at a "
                            f"time: only a ModuleNet can (got {type(net).__name__})")
        return _train_chunk_loop(flat, layout, net, x, y, orders, settings, anchor, mu, counts, prox, frozen)
    if counts is not None:   # unequal clients: torch.func with per-sample weights and per-client steps
        return _train_chunk_masked(flat, layout, net, x, y, orders, settings, anchor, mu, counts, prox, frozen)
    if net.dense_layers and settings.backprop == "auto" and not settings.compile:
        return _train_chunk_dense(flat, layout, net.dense_layers, x, y, orders, settings, anchor, mu, prox, frozen)
    return _train_chunk_func(flat, layout, net, x, y, orders, settings, anchor, mu, prox, frozen)


def check_anchor(anchor: torch.Tensor | None, mu: float, flat: torch.Tensor) -> torch.Tensor | None:
    """The proximal centre as ``[C, P]`` (a ``[P]`` anchor is broadcast, no
    copy), or None when there is no proximal term (no anchor or mu = 0).
    An anchor sharing memory with ``flat`` (trained in place) is copied first."""
    mu = float(mu)
    if not (mu >= 0 and mu != float("inf")):
        raise ValueError(f"proximal weight mu = {mu!r}: must be a finite number >= 0 (the algorithm's section checks "
                         "its own key first)")
    if anchor is None or mu == 0.0:
        return None
    if anchor.shape not in (flat.shape, flat.shape[1:]):
        raise ValueError(f"anchor must be [P] or [C, P] = {tuple(flat.shape)}, got {tuple(anchor.shape)}")
    if anchor.device != flat.device or anchor.dtype != flat.dtype:
        raise ValueError(f"anchor ({anchor.dtype} on {anchor.device}) must share dtype and device with "
                         f"flat ({flat.dtype} on {flat.device})")
    if anchor.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr():
        anchor = anchor.clone()
    return anchor.expand_as(flat)


def train_round(flat: torch.Tensor, layout: ParamLayout, arch: Arch, x: Inputs, y: torch.Tensor,
                orders: torch.Tensor, settings: TrainSettings, anchor: torch.Tensor | None = None,
                mu: float = 0.0, counts: torch.Tensor | None = None,
                prox_layers: tuple[str, ...] | None = None, train: torch.Tensor | None = None,
                phases=None) -> torch.Tensor:
    """One round of local SGD for every client (docs/algorithms.md), in place on ``flat`` [C, P].

    x [C, N, *input], y [C, N]; orders [epochs, C, N]: client c's sample order
    in each epoch (:func:`fedclust.rng.batch_orders`), cut into consecutive
    batches of ``settings.batch_size`` (the last one smaller).  Loss: mean
    cross-entropy of the batch, plus ``mu/2 ||w - anchor||^2`` when an
    ``anchor`` ([P] or [C, P]) is given (FedProx, FPFC: the gradient gains
    ``mu (w - anchor)``).  Momentum starts at zero.  Returns each client's
    mean batch cross-entropy over the round [C] (without the proximal term).
    ``counts`` [C]: client c holds only its first counts[c] of the N
    positions (the rest padding; orders from ``batch_orders(..., counts)``
    list its own examples first): its epoch is ceil(counts[c] / batch_size)
    batches of its own examples, and it does not step while others still
    have batches (see :func:`_train_chunk_masked`).  ``prox_layers``: names
    of the parameter tensors (``layout.names``) that carry the proximal
    term, the others train plain (FPFC's ``fpfc.fuse=head``: the classifier
    head only); None: every tensor.  ``train`` bool [C]: only those rows
    train (the round's participants), the others are left as they are and
    their loss is NaN; a client's bits do not depend on which others train.
    ``phases``: ``((epochs, frozen tensor names), ...)``, the round's epochs in
    phases, each keeping the tensors it names (:meth:`ParamLayout.select`) as
    they were (one momentum buffer throughout, which builds on the frozen
    tensors too: ``torch.optim.SGD`` with them restored after each step;
    DePRL's head, then body); None: every tensor every epoch.
    """
    counts, train = _check_round(flat, layout, x, y, orders, settings, counts, train)
    c, n = y.shape
    anchor = check_anchor(anchor, mu, flat)
    prox = proximal_layers(layout, prox_layers)
    frozen = frozen_epochs(layout, phases, settings.epochs)
    orders = orders.to(x.device)
    y = y.to(x.device)
    losses = torch.full((c,), float("nan"), dtype=flat.dtype, device=flat.device)
    if counts is not None and as_net(arch).engine != "loop":
        groups = width_groups(counts, n)
        if len(groups) > 1 or groups[0][0] < n:   # unequal clients: each trained at its own group's width
            for width, members in groups:
                members = members if train is None else members[train[members]]
                if members.numel():
                    _train_at_width(flat, layout, arch, x, y, orders, settings, anchor, float(mu), counts,
                                    prox_layers, phases, width, members, losses)
            return losses
    for chunk in _chunks(c, settings.client_chunk or train_chunk_size(arch, layout, x, min(n, settings.batch_size)),
                         train, flat.device):
        sub = flat[chunk]
        losses[chunk] = _train_chunk(sub, layout, arch, x[chunk], y[chunk], orders[:, chunk], settings,
                                     None if anchor is None else anchor[chunk], float(mu),
                                     None if counts is None else counts[chunk], prox, frozen)
        if train is not None:
            flat[chunk] = sub
    return losses


def _chunks(c: int, size: int, train: torch.Tensor | None, device) -> list[slice] | list[torch.Tensor]:
    """Chunks of ``size`` clients, each trained at once: slices of the ``c`` rows (views, trained in place), or
    chunks of the rows that train (``train``: copies of a chunk's weights and data, written back)."""
    if train is None:
        return [slice(c0, min(c, c0 + size)) for c0 in range(0, c, size)]
    return [rows for rows in train.nonzero().flatten().to(device).split(size) if rows.numel()]


def _check_round(flat, layout: ParamLayout, x: Inputs, y: torch.Tensor, orders: torch.Tensor,
                 settings: TrainSettings, counts: torch.Tensor | None, train: torch.Tensor | None):
    """``(counts, train)`` of :func:`train_round` checked (train on the CPU); ValueError naming what is wrong."""
    _check_data(flat, layout, x, y)
    counts = _check_counts(counts, c=y.shape[0], n=y.shape[1], device=x.device)
    c, n = y.shape
    if orders.dim() != 3 or orders.shape[1:] != (c, n):
        raise ValueError(f"orders must be [epochs, C={c}, N={n}], got shape {tuple(orders.shape)}; "
                         "make it with fedclust.rng.batch_orders")
    if orders.shape[0] != settings.epochs:
        raise ValueError(f"orders has {orders.shape[0]} epochs but settings.epochs = {settings.epochs}")
    if train is not None:
        if train.shape != (c,) or train.dtype != torch.bool:
            raise ValueError(f"train must be a bool [C={c}] mask, got {train.dtype} {tuple(train.shape)}")
        train = train.cpu()
    return counts, train


def _train_at_width(flat, layout, arch, x, y, orders, settings, anchor, mu: float, counts, prox_layers, phases,
                    width: int, members: torch.Tensor, losses: torch.Tensor) -> None:
    """Train the clients ``members`` (of one :func:`width_groups` group) on their first ``width`` positions, in
    place on their rows of ``flat``, their losses into ``losses``."""
    rows, at = members.to(flat.device), members.to(x.device)
    own = orders[:, at, :width]
    if bool((own >= width).any()):
        raise ValueError("orders must list each client's own examples first and its padding after, in "
                         "place order: make them with fedclust.rng.batch_orders(..., counts)")
    sub = flat.index_select(0, rows)
    losses[rows] = train_round(sub, layout, arch, x[at, :width], y[at, :width], own, settings,
                               None if anchor is None else anchor.index_select(0, rows), mu,
                               counts[at], prox_layers, phases=phases)
    flat.index_copy_(0, rows, sub)


def client_width(counts: torch.Tensor, n: int) -> torch.Tensor:
    """``[C]`` the width a client of ``counts[c]`` examples trains at: the
    smallest power of two that holds them, at most ``n``.  A function of the
    client's own count alone, so that its arithmetic (and its bits) never
    depends on which clients share its pass or its rank."""
    width = torch.ones_like(counts)
    while bool((width < counts).any()):
        width = torch.where(width < counts, width * 2, width)
    return width.clamp(max=n)


def width_groups(counts: torch.Tensor, n: int) -> list[tuple[int, torch.Tensor]]:
    """``[(width, client rows)]``, widths ascending: clients of unequal sizes
    grouped by :func:`client_width`, so that none computes on more than
    twice its examples of padding (the whole ``n`` before)."""
    width = client_width(counts, n)
    return [(int(w), (width == w).nonzero().flatten().cpu()) for w in torch.unique(width).tolist()]


def _check_counts(counts: torch.Tensor | None, c: int, n: int, device) -> torch.Tensor | None:
    """``counts`` as [C] int64 on ``device``, each in [1, N]; None stays None."""
    if counts is None:
        return None
    counts = torch.as_tensor(counts).to(device=device, dtype=torch.int64)
    if counts.shape != (c,) or (c and (int(counts.min()) < 1 or int(counts.max()) > n)):
        raise ValueError(f"counts must be [C={c}] numbers of examples in [1, N={n}], got {counts.tolist()[:10]}")
    return counts


@torch.no_grad()
def _loss_sums(models: torch.Tensor, layout: ParamLayout, arch: Arch, x: torch.Tensor, y: torch.Tensor,
               chunk: int, counts: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed correct predictions and summed cross-entropy of models[m] on
    x[m] [M, N, ...], y[m] (only its first counts[m] samples when given);
    samples in chunks of ``chunk``; a module of the user's in eval mode."""
    with evaluating(arch):
        return _loss_sums_in(models, layout, arch, x, y, chunk, counts)


def _loss_sums_in(models: torch.Tensor, layout: ParamLayout, arch: Arch, x: torch.Tensor, y: torch.Tensor,
                  chunk: int, counts: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    forward = batched_forward_fn(arch)
    params = layout.views(models)
    correct = torch.zeros(models.shape[0], dtype=models.dtype, device=models.device)
    loss = torch.zeros_like(correct)
    for s0 in range(0, x.shape[1], chunk):
        logits = forward(params, x[:, s0:s0 + chunk])
        yb = y[:, s0:s0 + chunk]
        if counts is None:
            correct += (logits.argmax(-1) == yb).sum(1).to(correct.dtype)
            loss += per_client_cross_entropy(logits, yb, reduction="sum")
            continue
        m, b, k = logits.shape
        real = torch.arange(s0, s0 + b, device=yb.device)[None, :] < counts[:, None]
        correct += ((logits.argmax(-1) == yb) & real).sum(1).to(correct.dtype)
        ce = F.cross_entropy(logits.reshape(m * b, k), yb.reshape(m * b), reduction="none").view(m, b)
        loss += (ce * real).sum(1)
    return correct, loss


@torch.no_grad()
def sample_losses(models: torch.Tensor, layout: ParamLayout, arch: Arch, x: Inputs, y: torch.Tensor,
                  counts: torch.Tensor | None = None) -> torch.Tensor:
    """``[C, N]``: the cross-entropy of model c on each of client c's examples (x [C, N, ...], y [C, N]); +inf at a
    padding position (beyond ``counts[c]``).  Clients and examples in chunks sized from memory (FedSpd's
    assignment of each example to the model that fits it best)."""
    _check_data(models, layout, x, y)
    c, n = y.shape
    counts = _check_counts(counts, c, n, x.device)
    y = y.to(x.device)
    forward = batched_forward_fn(arch)
    rows, chunk = eval_chunk_sizes(arch, x, c, n)
    out = torch.empty(c, n, dtype=models.dtype, device=models.device)
    for c0 in range(0, c, rows):
        c1 = min(c, c0 + rows)
        params = layout.views(models[c0:c1])
        for s0 in range(0, n, chunk):
            with evaluating(arch):
                logits = forward(params, x[c0:c1, s0:s0 + chunk])
            m, b, k = logits.shape
            yb = y[c0:c1, s0:s0 + chunk]
            out[c0:c1, s0:s0 + b] = F.cross_entropy(logits.reshape(m * b, k), yb.reshape(m * b),
                                                    reduction="none").view(m, b).to(out.dtype)
    if counts is not None:
        out.masked_fill_(torch.arange(n, device=out.device)[None, :] >= counts[:, None].to(out.device), math.inf)
    return out


def evaluate(flat: torch.Tensor, layout: ParamLayout, arch: Arch, x: Inputs, y: torch.Tensor,
             chunk: int | None = None, counts: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Accuracy in [0, 1] and mean cross-entropy [C] of model c on its own
    x[c] [N, ...], y[c] (docs/algorithms.md; only its first counts[c] samples
    when ``counts`` is given), all clients at once; ``chunk`` samples per
    client per pass (default: sized from memory)."""
    _check_data(flat, layout, x, y)
    c, n = y.shape
    counts = _check_counts(counts, c, n, x.device)
    y = y.to(x.device)
    rows, auto_chunk = eval_chunk_sizes(arch, x, c, min(chunk or n, n))
    chunk = chunk or auto_chunk
    acc = torch.empty(c, dtype=flat.dtype, device=flat.device)
    loss = torch.empty_like(acc)
    for c0 in range(0, c, rows):
        c1 = min(c, c0 + rows)
        part = None if counts is None else counts[c0:c1]
        correct, loss_sum = _loss_sums(flat[c0:c1], layout, arch, x[c0:c1], y[c0:c1], chunk, part)
        size = n if part is None else part.to(flat.dtype)
        acc[c0:c1] = correct / size
        loss[c0:c1] = loss_sum / size
    return acc, loss


def pair_losses(models: torch.Tensor, layout: ParamLayout, arch: Arch, x: Inputs, y: torch.Tensor,
                owner: torch.Tensor, counts: torch.Tensor | None = None) -> torch.Tensor:
    """Mean cross-entropy of models[m] [M, P] on the whole training set of
    client owner[m] (x [C, N, ...], y [C, N]; its first counts[owner[m]]
    samples when ``counts`` [C] is given) -> [M] (docs/algorithms.md loss similarity)."""
    if models.dim() != 2 or models.shape[1] != layout.numel:
        raise ValueError(f"models must be [M, P={layout.numel}], got shape {tuple(models.shape)}")
    owner = owner.to(device=x.device, dtype=torch.long)
    if owner.shape != (models.shape[0],):
        raise ValueError(f"owner must be [M={models.shape[0]}] client indices, got shape {tuple(owner.shape)}")
    if owner.numel() and (owner.min() < 0 or owner.max() >= x.shape[0]):
        raise ValueError(f"owner indices must lie in [0, {x.shape[0]}), got {owner.min().item()}..{owner.max().item()}")
    m, n = models.shape[0], x.shape[1]
    y = y.to(x.device)
    counts = _check_counts(counts, x.shape[0], n, x.device)
    rows, chunk = eval_chunk_sizes(arch, x, m, n)
    out = torch.empty(m, dtype=models.dtype, device=models.device)
    # model m on client m (a bank's or a cluster's models scored by every client): slices, no copy of the data
    aligned = m == x.shape[0] and bool(torch.equal(owner, torch.arange(m, device=owner.device)))
    for m0 in range(0, m, rows):
        own = owner[m0:m0 + rows]
        part = None if counts is None else counts[own]
        xs, ys = (x[m0:m0 + rows], y[m0:m0 + rows]) if aligned else (x[own], y[own])
        _, loss_sum = _loss_sums(models[m0:m0 + rows], layout, arch, xs, ys, chunk, part)
        out[m0:m0 + rows] = loss_sum / (n if part is None else part.to(models.dtype))
    return out


def batch_grads(models: torch.Tensor, layout: ParamLayout, arch: Arch, x: Inputs, y: torch.Tensor,
                owner: torch.Tensor, examples: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``[M, P]``: the gradient of ``Σ_b weights[m, b] · CE(models[m]; example examples[m, b] of client
    owner[m])`` for each model (x [C, N, ...], y [C, N]; ``examples`` [M, B] positions in the owner's rows,
    ``weights`` [M, B], 0 at a position left out), by autograd through the batched forward, a module of the
    user's in eval mode (no dropout draw).  Rows go in chunks of the training's size; each row's gradient is
    its own (the models share no parameter).  CoBo's gradients at the midpoint of two clients' models."""
    if models.dim() != 2 or models.shape[1] != layout.numel:
        raise ValueError(f"models must be [M, P={layout.numel}], got shape {tuple(models.shape)}")
    m = models.shape[0]
    if owner.shape != (m,) or examples.shape[0] != m or weights.shape != examples.shape:
        raise ValueError(f"owner [M={m}], examples [M, B] and weights [M, B] expected, got {tuple(owner.shape)}, "
                         f"{tuple(examples.shape)}, {tuple(weights.shape)}")
    owner = owner.to(device=y.device, dtype=torch.long)
    examples = examples.to(device=y.device, dtype=torch.long)
    forward = batched_forward_fn(arch)
    out = torch.zeros_like(models)
    rows = max(1, train_chunk_size(arch, layout, x, max(1, examples.shape[1])))
    with evaluating(arch):
        for m0 in range(0, m, rows):
            m1 = min(m, m0 + rows)
            sub = models[m0:m1].detach().clone().requires_grad_(True)
            own = owner[m0:m1, None]
            xb, yb = x[own, examples[m0:m1]], y[own, examples[m0:m1]]
            logits = forward(layout.views(sub), xb.to(models.device))
            c, b, k = logits.shape
            ce = F.cross_entropy(logits.reshape(c * b, k), yb.to(models.device).reshape(c * b),
                                 reduction="none").view(c, b)
            (ce * weights[m0:m1].to(ce.dtype)).sum().backward()
            assert sub.grad is not None
            out[m0:m1] = sub.grad
    return out
