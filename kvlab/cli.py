"""The ``kvlab`` command: environment report, model preparation, course build."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvlab.errors import KVLabError


def _env(_: argparse.Namespace) -> int:
    from kvlab.envinfo import print_env

    print_env()
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from kvlab.model import default_model_dir, is_prepared, prepare_default_model

    if is_prepared() and not args.force:
        print(f"Default model already prepared and verified: {default_model_dir()}")
        return 0
    path = prepare_default_model(force=args.force)
    print(f"Prepared and verified (checksum + 'Paris' answer): {path}")
    return 0


def _build(args: argparse.Namespace) -> int:
    from kvlab.course import build, lessons

    chosen = [Path(p).resolve() for p in args.notebooks] or lessons()
    index, runs = build(chosen, Path(args.out).resolve() if args.out else None)
    for r in runs:
        print(f"{'ok    ' if r.ok else 'FAILED'} {r.name} ({r.seconds:.0f} s){'  ' + r.error if r.error else ''}")
    print(f"\nCourse report: {index}\nOpen it in a browser: file://{index}")
    return 0 if all(r.ok for r in runs) else 1


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
    b.set_defaults(func=_build)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except KVLabError as exc:
        print(f"kvlab: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
