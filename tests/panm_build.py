"""PANM objects for the tests, built as a run builds them (checked first)."""

from fedclust.algorithms.panm import PANMGrad, PANMLoss


def make_panm_loss(cfg):
    PANMLoss.check(cfg)
    return PANMLoss.from_config(cfg)


def make_panm_grad(cfg):
    PANMGrad.check(cfg)
    return PANMGrad.from_config(cfg)
