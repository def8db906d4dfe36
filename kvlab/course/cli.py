"""The ``kvlab`` command: environment report, model preparation, course build, lab grids."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvlab import stepmodel
from kvlab.course import grid, labs
from kvlab.course.build import broken_links, build, lessons
from kvlab.runtime.envinfo import print_env
from kvlab.runtime.errors import KVLabError
from kvlab.runtime.gguf import default_model_dir, is_prepared, prepare_default_model


def _env(_: argparse.Namespace) -> int:

    print_env()
    return 0


def _prepare(args: argparse.Namespace) -> int:

    if is_prepared() and not args.force:
        print(f"Default model already prepared and verified: {default_model_dir()}")
        return 0
    path = prepare_default_model(force=args.force)
    print(f"Prepared and verified (checksum + 'Paris' answer): {path}")
    return 0


def _build(args: argparse.Namespace) -> int:

    chosen = [Path(p).resolve() for p in args.notebooks] or lessons()
    index, runs = build(chosen, Path(args.out).resolve() if args.out else None, run=not args.no_run)
    for r in runs:
        print(f"{'ok    ' if r.ok else 'FAILED'} {r.name} ({r.seconds:.0f} s: start-ups {r.startup_s:.0f} s, "
              f"the rest {r.seconds - r.startup_s:.0f} s){'  ' + r.error if r.error else ''}")
    total, starts = sum(r.seconds for r in runs), sum(r.startup_s for r in runs)
    print(f"whole course: {total / 60:.1f} min (start-ups {starts / 60:.1f} min, the rest {(total - starts) / 60:.1f} min)")
    broken = broken_links(index.parent)
    for link in broken:
        print(f"broken link: {link}")
    print(f"\nCourse report: {index}\nOpen it in a browser: file://{index}")
    return 0 if all(r.ok for r in runs) and not broken else 1


def _labs_list(_: argparse.Namespace) -> int:

    for lab in labs.all_labs():
        print(f"{lab.name} · {lab.title}: {lab.about}")
        for p in lab.params:
            rules = f"  [{p.rules()}]" if p.rules() else ""
            print(f"    {p.name:<24} {p.type_name:<6} = {p.default!r:<28} {p.doc}{rules}")
    return 0


def _labs_run(args: argparse.Namespace) -> int:

    table = grid.run_grid(args.grid, args.out, timeout_s=args.timeout, ray_address=args.ray)
    executed = table[table.action == "executed"]
    failed = table[table.status != "ok"]
    print(f"\n{len(table)} runs: {len(executed)} executed now, {len(table) - len(executed)} skipped (already done), "
          f"{len(failed)} failed.")
    for _, r in failed.iterrows():
        print(f"FAILED {r.run_id}: {r.error}")
    return 1 if len(failed) else 0


def _labs_collect(args: argparse.Namespace) -> int:

    tables = grid.collect(args.out)
    for lab, t in tables.items():
        print(f"{lab}: {t.run_id.nunique()} runs, {len(t)} rows")
    print(f"written to {Path(args.out).resolve() / 'collected'}")
    return 0


def _labs_reference(args: argparse.Namespace) -> int:

    for path in grid.publish_reference(args.out, args.dest):
        print(f"reference results: {path}")
    return 0


def _forecast_calibrate(args: argparse.Namespace) -> int:
    model = stepmodel.calibrate_and_check(args.model, quick=args.quick, out=args.out)
    print(model.describe().to_string(index=False))
    print(f"{model.form} form, {model.points} step compositions, median |residual| {model.median_abs_residual():.1%} "
          f"(the other form: {model.other_form['median_abs_residual']:.1%}); held-out points: median |error| "
          f"{model.meta['held_out_median_abs_error']:.1%}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``kvlab`` console script."""
    parser = argparse.ArgumentParser(prog="kvlab", description="KV Lab: LLM inference, measured on a real vLLM engine.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("env", help="print the environment report (paste it into bug reports)").set_defaults(func=_env)
    p = sub.add_parser("prepare-model", help="convert and verify the default model once (idempotent)")
    p.add_argument("--force", action="store_true", help="convert again even if a verified copy exists")
    p.set_defaults(func=_prepare)
    b = sub.add_parser("build", help="execute the notebooks headless and write HTML pages plus an index")
    b.add_argument("notebooks", nargs="*", help="notebooks to run (default: every numbered lesson)")
    b.add_argument("--out", help="output folder (default: KVLAB_BUILD_DIR or build/)")
    b.add_argument("--no-run", action="store_true",
                   help="do not execute: render the notebooks as written (a preview of prose and links in seconds)")
    b.set_defaults(func=_build)
    labs_cmd = sub.add_parser("labs", help="list the labs, run a grid of lab runs, collect their results")
    lsub = labs_cmd.add_subparsers(dest="labs_command", required=True)
    lsub.add_parser("list", help="every lab with its parameters, types, defaults and units").set_defaults(func=_labs_list)
    r = lsub.add_parser("run", help="run a grid file (resumable: finished runs are skipped)")
    r.add_argument("grid", help="grid YAML file, e.g. labs/grids/example.yaml")
    r.add_argument("--out", help="output folder (default: the grid's 'output:' or build/grids/<name>)")
    r.add_argument("--timeout", type=int, default=None, help="seconds any one notebook cell may run (default: no limit)")
    r.add_argument("--ray", metavar="ADDRESS", default=None,
                   help="run each lab run as a Ray task that owns one GPU or a whole node: 'local' (a Ray instance on "
                        "127.0.0.1, this machine only), 'auto' (the cluster `ray start` joined) or ray://HOST:PORT; "
                        "needs the ray extra (pip install -e .[ray]). Default: run here, one after another")
    r.set_defaults(func=_labs_run)
    c = lsub.add_parser("collect", help="gather a grid's results into one table per lab, with parameters and machine")
    c.add_argument("out", help="the grid's output folder")
    c.set_defaults(func=_labs_collect)
    ref = lsub.add_parser("reference", help="copy a grid's results (tables + metadata) into a reference folder")
    ref.add_argument("out", help="the grid's output folder")
    ref.add_argument("dest", help="e.g. data/reference/cpu")
    ref.set_defaults(func=_labs_reference)
    f = sub.add_parser("forecast", help="the step-time model: calibrate it on this machine")
    fsub = f.add_subparsers(dest="forecast_command", required=True)
    fc = fsub.add_parser("calibrate", help="fit the step model on this machine and model, check it on held-out steps, "
                                           "write step_model.json")
    fc.add_argument("--model", default=None, help="model name or folder (default: KVLAB_MODEL or the course model)")
    fc.add_argument("--out", default=None, help="output folder (default: build/forecast)")
    fc.add_argument("--quick", action="store_true", help="the quick sweep (about a minute) instead of the full one")
    fc.set_defaults(func=_forecast_calibrate)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except KVLabError as exc:
        print(f"kvlab: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
