"""FPFC's head-only fusion (``fpfc.fuse=head``, the official MNIST/FMNIST
code): the pairs fuse the model's last layer, which alone carries the local
proximal term; the body is the round's participants' plain mean."""

from __future__ import annotations

import torch

from fedclust.engine.layout import ParamLayout
from fedclust.errors import ConfigError


def head_layers(layout: ParamLayout) -> tuple[tuple[str, ...], int]:
    """``(names, first)``: the parameter tensors of the model's last layer,
    those of ``layout.names`` (``named_parameters`` order) that share the
    last name's module (``fc3.weight``, ``fc3.bias`` → ``fc3``), and the
    first column of the flat row they occupy (they end it: the head is
    columns ``first .. P − 1``, the body ``0 .. first − 1``).  Refuses
    (ConfigError on ``fpfc.fuse``) a model whose last layer cannot be told
    that way: a last parameter owned by no submodule."""
    names = layout.names
    module = names[-1].rpartition(".")[0] if names else ""
    if not module:
        raise ConfigError("fpfc.fuse", "head", f"the model's last parameter tensor {names[-1:]} belongs to no "
                          f"submodule, so its last layer (the head) cannot be told; give the classifier its own "
                          f"layer (e.g. self.head = nn.Linear(...)), or use fpfc.fuse=all")
    # named_parameters lists a module's own tensors, then its children's: the last name's module has no
    # children with parameters, and its own tensors are the last ones of the row
    k = len(names)
    while k and names[k - 1].rpartition(".")[0] == module:
        k -= 1
    return names[k:], layout.offsets[k]


def fused_columns(cfg, layout: ParamLayout) -> tuple[tuple[str, ...] | None, int]:
    """``(prox_layers, first)`` of a run of a model of ``layout``: the
    tensors that carry the local proximal term (None: all) and the first of
    the columns ``first .. P − 1`` the pairs fuse; ``(None, 0)`` for
    ``fpfc.fuse=all``, the head's (:func:`head_layers`) for ``head``."""
    if cfg.fpfc.fuse != "head":
        return None, 0
    return head_layers(layout)


def average_body_(omega: torch.Tensor, active: torch.Tensor, first: int) -> torch.Tensor:
    """The official LABELSWAP server's last step (``FPFC.server``, after the
    pairs'): the body, columns ``0 .. first − 1`` of ``omega [n, P]``, of
    every participant (``active`` bool ``[n]``) becomes the participants'
    plain mean (equal weights, whatever their sample counts); the
    non-participants keep their own body.  In place; ``first = 0`` (no body)
    leaves ``omega`` as it is."""
    if first and bool(active.any()):
        omega[active, :first] = omega[active, :first].mean(dim=0)
    return omega

