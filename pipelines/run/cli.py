"""Command line: the whole benchmark, or one step of it, without Airflow.

    python -m pipelines data  --profile smoke --output runs [--set key=value ...]
    python -m pipelines train --backend <platform> --workers 2 --profile smoke --output runs
    python -m pipelines train --backend <platform> --workers 4 --run-dir R --node-rank 1   # 2nd node
    python -m pipelines run   --profile smoke --output runs
    python -m pipelines report runs/<run_id> [--tracking-uri URI]   # re-report from the folder alone
    python -m pipelines whatif runs/<run_id> --hosts 8 --workers-per-host 4 --network 25gbit --step-ms 12

``<platform>``: a registered platform's name (``train --help`` lists them). ``--output`` is the output root; each invocation works in ``<output>/<run_id>/`` (``--run-id``
names it; default ``<profile>-<UTC timestamp>``). Pass ``--run-dir`` to continue in an existing
run folder (its config.json wins): a re-run resumes training from the last checkpoints.
Config overrides: ``--set training.epochs=3 --set 'matrix.backends=["<platform>","<platform>"]'`` (JSON values;
the flat names ``epochs``, ``backends`` work too), on top of
this host's defaults in BENCHMARK_DATASET_SOURCE / _TOKENIZER_SOURCE / _MODEL_SOURCE /
_OUTPUT_ROOT (set by scripts/airflow_env.sh when ../shared/data exists), as in the DAG.
After training, ``run`` and ``report`` follow ``pipelines.run.runner`` (evaluate -> report ->
MLflow -> regression check), the same policy as the Airflow DAG. Exit status: 0 success,
1 a step or a cell failed (the message names it and says how to resume), 2 bad input.
``--verbose`` shows debug logs and the traceback of a failure.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import traceback
from pathlib import Path

from pipelines import platforms
from pipelines.run import runner, stages
from pipelines.config import PROFILES, ConfigError, parse_set_options, site_defaults
from pipelines.runfolder.paths import RunPaths
from pipelines.measure.signals import CellTerminated

log = logging.getLogger("pipelines")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipelines", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logs and tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)

    def with_run_options(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--profile", default="smoke", choices=sorted(PROFILES))
        p.add_argument("--output", help="output root (default: the profile's, 'runs')")
        p.add_argument("--run-id", help="run folder name under the output root")
        p.add_argument("--run-dir", help="continue in this existing run folder")
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override one config field by dotted path (training.epochs=3) or flat "
                            "name (epochs=3); JSON values; repeatable")
        return p

    with_run_options(sub.add_parser("data", help="ingest, validate and tokenize"))
    train = with_run_options(sub.add_parser("train", help="train one (backend, workers) cell"))
    train.add_argument("--backend", required=True, choices=platforms.names())
    train.add_argument("--workers", required=True, type=int)
    train.add_argument("--repeat", type=int, default=0)
    train.add_argument("--strategy", default="default",
                       help="one of the run's strategies by name (default, fp16, powersgd-r2, localsgd-4, fsdp, "
                            "weighted_loss, ...; give the list with --set 'strategies=[...]')")
    train.add_argument("--network", help="one of the run's networks (default: its first; cluster runs)")
    train.add_argument("--node-rank", type=int, help="a platform whose cell runs on every node (several nodes): this machine's node rank")
    train.add_argument("--force", action="store_true", help="train the cell again even if it finished")
    run = with_run_options(sub.add_parser("run", help="the whole benchmark: data, every cell, report"))
    run.add_argument("--force", action="store_true",
                     help="with --run-dir: train finished cells again from scratch (default: skip them)")
    report = sub.add_parser("report", help="evaluate + report (+ MLflow) from a finished run folder")
    report.add_argument("run_dir")
    report.add_argument("--no-mlflow", action="store_true", help="write files only")
    report.add_argument("--tracking-uri", help="log to this MLflow store instead of the run's")
    whatif = sub.add_parser("whatif", help="each platform's time on another cluster, device or job, from the "
                                           "model fitted on the run's cells (pipelines.whatif)")
    whatif.add_argument("run_dir", nargs="+", help="run folder(s) whose cells the model is fitted on")
    whatif.add_argument("--hosts", type=int, required=True, help="machines in the target cluster")
    whatif.add_argument("--workers-per-host", type=int, default=1, help="ranks (GPUs) per machine")
    whatif.add_argument("--network", default="10gbit", help="the hosts' links: 'unshaped' or a rate (25gbit, 100mbit)")
    whatif.add_argument("--step-ms", type=float, help="the target device's training step (ms) for this model and "
                                                        "per-rank batch; default: the run's own device")
    whatif.add_argument("--reference-seconds", type=float,
                        help="instead of --step-ms: the step at which the reference platform takes this long "
                             "for the job on --reference-workers hosts (the study: 499 on 2)")
    whatif.add_argument("--reference-workers", type=int, default=2)
    whatif.add_argument("--cpu-share", type=float, help="each host's CPU as a share of the run's hosts' (0.5: half)")
    whatif.add_argument("--job", default="25000x20", help="REVIEWSxEPOCHS[xTEST_REVIEWS] (default 25000x20, "
                                                          "tested on as many reviews as trained)")
    whatif.add_argument("--json", action="store_true", help="print the answer as JSON")
    return parser


_WHATIF_FLAGS = {"hosts": "--hosts", "workers_per_host": "--workers-per-host", "network": "--network",
                 "step_ms": "--step-ms", "reference_seconds": "--reference-seconds",
                 "reference_workers": "--reference-workers", "cpu_share": "--cpu-share", "job": "--job"}


def whatif_target(args: argparse.Namespace):
    """The question, checked before anything is read or computed: ConfigError names the flag."""
    from pydantic import ValidationError

    from pipelines.config.sections import WhatIfConfig

    parts = str(args.job).lower().split("x")
    if len(parts) not in (2, 3) or not all(p.strip().isdigit() for p in parts):
        raise ConfigError(f"--job: {args.job!r} is not REVIEWSxEPOCHS[xTEST_REVIEWS] (e.g. 25000x20)")
    job = {"train_samples": int(parts[0]), "epochs": int(parts[1]),
           "test_samples": int(parts[2]) if len(parts) == 3 else int(parts[0])}
    try:
        return WhatIfConfig(hosts=args.hosts, workers_per_host=args.workers_per_host, network=args.network,
                            step_ms=args.step_ms, reference_seconds=args.reference_seconds,
                            reference_workers=args.reference_workers, cpu_share=args.cpu_share, job=job)
    except ValidationError as err:
        raise ConfigError("; ".join(f"{_WHATIF_FLAGS.get(str(e['loc'][0]), e['loc'][0])}"
                                    f"{'.' + '.'.join(map(str, e['loc'][1:])) if len(e['loc']) > 1 else ''}: "
                                    f"{e['msg']} (got {e.get('input')!r})" for e in err.errors())) from None


def _whatif(args: argparse.Namespace) -> int:
    from pipelines import whatif
    from pipelines.whatif.answer import ask, text
    from pipelines.whatif.predict import WhatIfError

    target = whatif_target(args)
    for run_dir in args.run_dir:
        if not RunPaths.is_run_folder(Path(run_dir)):
            raise ConfigError(f"{run_dir}: no config.json there (not a run folder)")
    try:
        model = whatif.load_model(args.run_dir[0]) if len(args.run_dir) == 1 else whatif.fit_runs(args.run_dir)
        answer = ask(model, target, platforms.reference())
    except (whatif.NoFinishedCell, WhatIfError) as err:
        raise ConfigError(str(err)) from None
    print(json.dumps(answer.as_json(), indent=2) if args.json else text(answer))
    return 0


def _run_dir(args: argparse.Namespace) -> str:
    """The run folder: a new one (config resolved and checked), or ``--run-dir`` checked again.
    ``train`` checks only the cell it trains."""
    cells = [(args.backend, args.strategy, args.workers)] if args.command == "train" else None
    if args.run_dir:
        if not RunPaths.is_run_folder(Path(args.run_dir)):
            raise ConfigError(f"--run-dir {args.run_dir}: no config.json there (not a run folder)")
        run_dir = str(Path(args.run_dir).resolve())
        stages.check_run(run_dir, cells)
        return run_dir
    # this host's defaults (BENCHMARK_* variables, as in the DAG), then the command line
    overrides = {**site_defaults(), **parse_set_options(args.overrides)}
    if args.output:
        overrides["tracking.output_root"] = args.output
    run_id = args.run_id or f"{args.profile}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    return stages.prepare_run(args.profile, overrides, run_id, cells)


def _data_ready(run_dir: str) -> bool:
    """The token shards are there (a resumed run, or cells trained in a run folder made earlier)."""
    return any(RunPaths(Path(run_dir)).token_split("test").glob("part-*.parquet"))


def _ensure_data(run_dir: str) -> None:
    """Run the data steps (runner.DATA_STEPS, the DAG's order) unless the token shards are
    already there."""
    if not _data_ready(run_dir):
        log.info("data stage: %s", json.dumps(runner.data_stage(run_dir), default=str))


def _command(args: argparse.Namespace) -> int:
    if args.command == "whatif":
        return _whatif(args)
    if args.command == "report":
        if not RunPaths.is_run_folder(Path(args.run_dir)):
            raise ConfigError(f"{args.run_dir}: no config.json there (not a run folder)")
        runner.finish(str(Path(args.run_dir).resolve()), tracking_uri=args.tracking_uri,
                      with_mlflow=not args.no_mlflow)
        return 0
    run_dir = _run_dir(args)  # cheap checks first: a doomed run fails in seconds, not after the data stage
    print(f"run folder: {run_dir}", flush=True)
    # spark_master=embedded: the run's own standalone cluster; cluster.kind=emulated: its hosts;
    # started and stopped as the DAG's setup/teardown tasks do, when training ends (or fails, or
    # a signal stops the run)
    with stages.run_clusters(run_dir, data_stage=not _data_ready(run_dir)):
        _ensure_data(run_dir)
        if args.command == "train":
            try:
                print(json.dumps(stages.train_cell(run_dir, args.backend, args.workers, args.repeat,
                                                   node_rank=args.node_rank, force=args.force,
                                                   strategy=args.strategy, network=args.network)))
            except Exception as err:
                raise runner.StepFailed("train", err, runner.resume_hint("train", run_dir)) from err
            return 0
        if args.command != "run":  # data
            return 0
        failed = stages.train_cells(run_dir, args.force)
    try:
        runner.finish(run_dir)
    finally:  # the hint must come out whatever the steps after training did
        if failed:
            print(f"failed cells: {', '.join(failed)}; {runner.resume_hint('train', run_dir)}",
                  file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return _command(args)
    except CellTerminated as err:  # SIGTERM/SIGINT: the cell's processes are gone, its result says so
        print(f"error: {err}", file=sys.stderr)
        return 128 + err.signum
    except ConfigError as err:  # one line: the last thing a failed run prints says what was refused
        print("error: " + " ".join(line.strip() for line in str(err).splitlines()), file=sys.stderr)
        return 2
    except runner.StepFailed as err:
        if args.verbose:
            traceback.print_exception(err.cause, file=sys.stderr)
        print(f"error: {err}\n{err.hint}", file=sys.stderr)
        return 1
    except Exception as err:
        if args.verbose:
            traceback.print_exc(file=sys.stderr)
        print(f"error: {type(err).__name__}: {err} (--verbose shows the traceback)", file=sys.stderr)
        return 1
