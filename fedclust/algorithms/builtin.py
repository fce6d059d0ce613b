"""Registers every built-in algorithm under its config name."""

from fedclust.algorithms import baselines
from fedclust.algorithms.registry import register

register("local", baselines.make_local)
register("random", baselines.make_random)
register("fixtopology", baselines.make_fixtopology)
register("oracle", baselines.make_oracle)

from fedclust.algorithms import panm, pens  # noqa: E402

register("panm_loss", panm.make_panm_loss)
register("panm_grad", panm.make_panm_grad)
register("pens", pens.make_pens)

from fedclust.algorithms import cfl, fedavg, fedgroup, fpfc, ifca  # noqa: E402

register("fedavg", fedavg.make_fedavg)
register("fedprox", fedavg.make_fedprox)
register("ifca", ifca.make_ifca)
register("cfl", cfl.make_cfl)
register("fedgroup", fedgroup.make_fedgroup)
register("fedgrouprox", fedgroup.make_fedgrouprox)
register("fpfc", fpfc.make_fpfc)
