"""Command line: ``fedclust run|check|bench|bench-rounds|bench-scale|report|theory``."""

from __future__ import annotations

import argparse
import os
import sys

from fedclust.checkpoint import Stopped
from fedclust.errors import FedclustError


def _config_or_override(args) -> None:
    """``fedclust run|check KEY=VALUE ...`` without a CONFIG file starts from the defaults."""
    if args.config and "=" in args.config and not os.path.exists(args.config):
        args.overrides, args.config = [args.config, *args.overrides], None


def _run(args) -> int:
    from fedclust.config import load_config
    from fedclust.runner import prepare, run

    _config_or_override(args)
    cfg = load_config(args.config, args.overrides)
    out = prepare(cfg)  # every check before any process group starts
    run(cfg, out)
    return 0


def _check(args) -> int:
    from fedclust.config import dump, load_algorithms, load_config, read_yaml, valid_keys

    _config_or_override(args)
    if args.keys:   # the keys of every registered algorithm's section, plugins named in CONFIG/overrides included
        load_algorithms(read_yaml(args.config) if args.config else {}, args.overrides)
        print("\n".join(valid_keys()))
        return 0
    if args.config is None:
        raise FedclustError("fedclust check needs a CONFIG file (or --keys)")
    print(dump(load_config(args.config, args.overrides)), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fedclust", description="Clustered federated learning, vectorized.")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run an experiment")
    r.add_argument("config", help="YAML config file, e.g. configs/fmnist_rotation2.yaml (or none: the defaults)")
    r.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, e.g. algorithm.k=5")
    c = sub.add_parser("check", help="validate and print the resolved config")
    c.add_argument("config", nargs="?")
    c.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    c.add_argument("--keys", action="store_true", help="list every valid key")
    sub.add_parser("bench", help="time one round of local training (see fedclust bench --help)", add_help=False)
    sub.add_parser("bench-rounds", help="whole-round time of algorithms side by side (see fedclust bench-rounds --help)",
                   add_help=False)
    sub.add_parser("bench-scale", help="round time, gather and memory against the client count (see fedclust "
                   "bench-scale --help)", add_help=False)
    sub.add_parser("report", help="results table of run directories (see fedclust report --help)", add_help=False)
    sub.add_parser("theory", help="Theorem 1 of PANM (see fedclust theory --help)", add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "bench":
            from fedclust import bench

            return bench.main(argv[1:])
        if argv and argv[0] == "bench-rounds":
            from fedclust import bench_rounds

            return bench_rounds.main(argv[1:])
        if argv and argv[0] == "bench-scale":
            from fedclust import bench_scale

            return bench_scale.main(argv[1:])
        if argv and argv[0] == "report":
            from fedclust import report

            return report.main(argv[1:])
        if argv and argv[0] == "theory":
            from fedclust import theory

            return theory.main(argv[1:])
        args = build_parser().parse_args(argv)
        return {"run": _run, "check": _check}[args.command](args)
    except Stopped as exc:
        print(f"fedclust: {exc}", file=sys.stderr)
        return exc.exit_code
    except FedclustError as exc:
        print(f"fedclust: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
