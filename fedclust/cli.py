"""Command line: ``fedclust run|check|bench|bench-rounds|bench-scale|report|theory``.

Each command imports only what it needs, so ``fedclust --help``,
``--version`` and ``theory`` start without torch.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys

from fedclust.errors import FedclustError

EXIT_CONFIG = 2   # a config or usage error (argparse uses 2 as well)
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)   # a full, over-quota or read-only disk: one line, no traceback

RUN_EPILOG = """\
out: the run directory, by default runs/<algorithm>-<data>-s<seed>-<time>.
  Running the same command again into the same out continues from its newest
  checkpoint (resume=auto; resume=never refuses a directory holding a run,
  resume=require errors without a checkpoint). A directory holding a run that
  this config cannot continue is refused, naming the files; overwrite=true
  replaces it instead.

Every key, its default and its meaning: fedclust check --keys.
Validate and print the resolved config without running: fedclust check CONFIG [KEY=VALUE ...].

exit status:
  0   the run finished
  2   an error fedclust explains in one line: a config error (naming the key,
      the bad value and the fix; found before any data is read or process
      group starts), missing data, a diverged run, a rank that stopped or
      did not start, no usable checkpoint, a full disk
  75  stopped by SIGUSR1 or SIGTERM, after writing a checkpoint or during
      start-up before writing anything: run the same command again to
      continue (inside Slurm the job is requeued)
  1   anything else (a traceback)

examples:
  fedclust run configs/fmnist_rotation2.yaml
  fedclust run configs/fmnist_rotation2.yaml algorithm.name=oracle seed=1 out=runs/oracle-s1
  fedclust run rounds=3 clients=10 stage1_rounds=2     # the defaults, with three keys changed
"""

CHECK_EPILOG = """\
Prints the config a run would use (defaults, then CONFIG, then the
overrides), validated as fedclust run validates it (run also checks out and
W&B before reading data); with no CONFIG and no overrides, the defaults.

  fedclust check --keys                              every key, its default, its meaning
  fedclust check --keys plugins=[my_lab.algorithms]  with a plugin's keys

out defaults to runs/<algorithm>-<data>-s<seed>-<time>; running again into
the same out resumes from its newest checkpoint; overwrite=true replaces a run
there that this config cannot continue.

exit status: 0 the config is valid; 2 a config error (the message names the
key, the bad value and the fix).
"""


TRUST_HELP = ("import the code the run names (its plugins, its user model's file), which is never done otherwise: "
              "read those files first; a user model is imported only if it is the run's own (docs/running.md, "
              "\"Sharing runs and exports\")")


def version() -> str:
    """The installed distribution's version, else the source tree's."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("fedclust")
    except PackageNotFoundError:
        from fedclust import __version__

        return __version__


def _config_or_override(args) -> None:
    """``fedclust run|check KEY=VALUE ...`` without a CONFIG file starts from the defaults."""
    if args.config and "=" in args.config and not os.path.exists(args.config):
        args.overrides, args.config = [args.config, *args.overrides], None


def _run(args) -> int:
    _config_or_override(args)
    if args.config is None and not args.overrides:
        raise FedclustError("fedclust run needs a CONFIG file or KEY=VALUE overrides (a bare run of the defaults is "
                            "a 300-round Fashion-MNIST job): e.g. fedclust run configs/fmnist_rotation2.yaml, or "
                            "fedclust run seed=0 for the defaults as they are (fedclust check prints them)")
    from fedclust.config import load_config
    from fedclust.runner import prepare, run

    cfg = load_config(args.config, args.overrides)
    run(cfg, prepare(cfg))  # every check before any process group starts
    return 0


def key_table(rows: list[tuple[str, str, str]]) -> str:
    """``key  default  meaning``, the first two columns aligned."""
    head = ("key", "default", "meaning")
    rows = [head, *rows]
    wk = max(len(r[0]) for r in rows)
    wd = max(len(r[1]) for r in rows)
    return "\n".join(f"{k:<{wk}}  {d:<{wd}}  {m or '-'}".rstrip() for k, d, m in rows)


def _check(args) -> int:
    from fedclust.config import dump, load_algorithms, load_config, read_yaml

    _config_or_override(args)
    if args.reference:   # docs/config.md
        from fedclust.config import reference_markdown

        print(reference_markdown(), end="")
        return 0
    if args.keys:   # the keys of every registered algorithm's section, plugins named in CONFIG/overrides included
        from fedclust.algorithms import registry
        from fedclust.schema import describe_keys

        load_algorithms(read_yaml(args.config) if args.config else {}, args.overrides)
        print(key_table(describe_keys()))
        print(f"\nalgorithm.name is one of: {', '.join(registry.names())}")
        return 0
    print(dump(load_config(args.config, args.overrides)), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fedclust", description="Clustered federated learning, vectorized.")
    p.add_argument("--version", action="version", version=f"fedclust {version()}")
    sub = p.add_subparsers(dest="command", required=True)
    fmt = argparse.RawDescriptionHelpFormatter
    r = sub.add_parser("run", help="run an experiment", formatter_class=fmt, epilog=RUN_EPILOG,
                       description="Run an experiment: the defaults, then CONFIG, then the KEY=VALUE overrides.")
    r.add_argument("config", nargs="?", metavar="CONFIG",
                   help="YAML config file, e.g. configs/fmnist_rotation2.yaml; may be left out when overrides are "
                        "given (they then change the defaults)")
    r.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, e.g. algorithm.k=5")
    c = sub.add_parser("check", help="validate and print the resolved config; --keys lists every key",
                       formatter_class=fmt, epilog=CHECK_EPILOG,
                       description="Validate a config and print it resolved, or list every key.")
    c.add_argument("config", nargs="?", metavar="CONFIG", help="YAML config file (optional)")
    c.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, e.g. clients=200")
    c.add_argument("--keys", action="store_true", help="list every valid key with its default and meaning")
    c.add_argument("--reference", action="store_true", help="print the config reference (docs/config.md) in Markdown")
    sub.add_parser("bench", help="time one round of local training (see fedclust bench --help)", add_help=False)
    sub.add_parser("bench-rounds",
                   help="whole-round time of algorithms side by side (see fedclust bench-rounds --help)",
                   add_help=False)
    sub.add_parser("bench-scale", help="round time, gather and memory against the client count (see fedclust "
                   "bench-scale --help)", add_help=False)
    sub.add_parser("report", help="results table of run directories (see fedclust report --help)", add_help=False)
    sub.add_parser("theory", help="Theorem 1 of PANM (see fedclust theory --help)", add_help=False)
    e = sub.add_parser("export", help="each client's model (safetensors) and a JSON manifest, from a run directory",
                       description="Write each client's model of RUN_DIR's newest checkpoint (models.safetensors, "
                                   "each parameter stacked over clients), the method's own models where it keeps "
                                   "some (method_models.safetensors) and manifest.json into OUT_DIR.")
    e.add_argument("run_dir", metavar="RUN_DIR")
    e.add_argument("out_dir", metavar="OUT_DIR")
    e.add_argument("--trust-code", action="store_true", help=TRUST_HELP)
    v = sub.add_parser("evaluate", help="every client's model on the run's test data, or on a file of new data",
                       description="Evaluate every client's model of RUN_DIR's newest checkpoint on the run's own "
                                   "test data (the run's client_accuracy of that round), or on --data FILE: an "
                                   ".npz of test examples in the natural form (x_test, y_test, client_test).")
    v.add_argument("run_dir", metavar="RUN_DIR")
    v.add_argument("--data", metavar="FILE", help="an .npz with x_test, y_test and client_test (the run's client "
                                                  "ids), normalised as the run's inputs")
    v.add_argument("--json", action="store_true", help='print {"accuracy": ..., "client_accuracy": [...]}')
    v.add_argument("--trust-code", action="store_true", help=TRUST_HELP)
    v.add_argument("--best", action="store_true", help="each client's model at its best-validation round "
                                                       "(a run with data.validation) instead of its last")
    v.add_argument("--unseen", action="store_true",
                   help="with --data: its clients are new ones (any ids; FLUX's unseen-client protocol): each takes, "
                        "of the method's models a new client may take (IFCA's, CFL's, FedGroup's cluster models; "
                        "DFCA's and FedSPD's banks; Facade's core with each head; a peer method's client models), "
                        "the one of lowest loss on the first half of its examples, and is scored on the rest")
    return p


def _export(args) -> int:
    from fedclust.export import export_run

    m = export_run(args.run_dir, args.out_dir, args.trust_code)
    extra = f" and the method's models ({', '.join(m['method_models'])})" if m["method_models"] else ""
    print(f"fedclust: exported {m['clients']} client models of round {m['round']} ({m['model']['spec']}){extra} "
          f"to {args.out_dir}")
    return 0


def _evaluate(args) -> int:
    import json

    from fedclust.export import evaluate_run, evaluate_unseen

    def warn(message: str) -> None:
        print(f"fedclust: warning: {message}", file=sys.stderr)

    if args.unseen:
        if not args.data or args.best:
            print("fedclust: error: --unseen scores new clients: give their examples with --data FILE (and no "
                  "--best)", file=sys.stderr)
            return 2
        r = evaluate_unseen(args.run_dir, args.data, args.trust_code, warn=warn)
    else:
        r = evaluate_run(args.run_dir, args.data, args.trust_code, args.best, warn=warn)
    if args.json:
        keys = ("accuracy", "client_accuracy") + (("clients", "choice", "candidates") if args.unseen else ())
        print(json.dumps({k: r[k] for k in keys}))
    else:
        print(f"round {r['round']}, {r['models']} models, {r['data']}: mean accuracy {r['accuracy']:.2f}% over "
              f"{len(r['client_accuracy'])} clients (lowest {min(r['client_accuracy']):.2f}%, highest "
              f"{max(r['client_accuracy']):.2f}%)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """The command line; ``argv`` None: the process's own (the program's entry point)."""
    process = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "run":
        return _main_run(argv, process)
    return _main(argv)


def _main_run(argv: list[str], process: bool) -> int:
    """``fedclust run``: SIGUSR1/SIGTERM are fedclust's from the first line
    (a signal while the config and data load stops the process at once, with
    a line saying so; one after the run's last line changes nothing: exit
    0), and under torchrun the process stops as on SIGTERM if torchrun dies.
    As the program's entry point (``process``) the handlers stay until the
    process exits; called as a function, they go back to what they were."""
    from fedclust.stopping import REQUEST, StartupSignal, stop_with_parent, stopped_at_startup

    REQUEST.install()
    REQUEST.begin()
    stop_with_parent()
    try:
        try:
            return _main(argv)
        except StartupSignal as sig:   # before the run began (config, plugins, imports)
            from fedclust.dist import launch_rank

            exc = stopped_at_startup(sig.signal, launch_rank())
            print(f"fedclust: {exc}", file=sys.stderr)
            return exc.exit_code
    finally:
        REQUEST.finished()   # the run is over, whichever way: a signal now changes nothing
        if not process:
            REQUEST.restore()


def _main(argv: list[str]) -> int:
    try:
        if argv and argv[0] == "bench":
            from fedclust.bench import local as bench

            return bench.main(argv[1:])
        if argv and argv[0] == "bench-rounds":
            from fedclust.bench import rounds as bench_rounds

            return bench_rounds.main(argv[1:])
        if argv and argv[0] == "bench-scale":
            from fedclust.bench import scale as bench_scale

            return bench_scale.main(argv[1:])
        if argv and argv[0] == "report":
            from fedclust import report

            return report.main(argv[1:])
        if argv and argv[0] == "theory":
            from fedclust import theory

            return theory.main(argv[1:])
        args = build_parser().parse_args(argv)
        return {"run": _run, "check": _check, "export": _export, "evaluate": _evaluate}[args.command](args)
    except FedclustError as exc:
        code = getattr(exc, "exit_code", None)   # fedclust.stopping.Stopped: 75, run again to continue
        if code is not None:
            print(f"fedclust: {exc}", file=sys.stderr)
            return code
        print(f"fedclust: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except OSError as exc:
        if exc.errno not in DISK_ERRNOS:
            raise
        where = f" writing {exc.filename}" if exc.filename else ""
        print(f"fedclust: error: {exc.strerror}{where} (errno {exc.errno}); free space there or choose another "
              "out=DIR, then run the same command again: a run continues from its newest checkpoint",
              file=sys.stderr)
        return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
