"""The `paraplan` dispatcher.

Every module in this package except `main` and `common` is a command: it defines
`NAME`, `HELP`, `ORDER` (position in `--help`), `add_arguments(parser)` and
`run(args) -> int`. Command modules import heavy packages (torch, mlflow,
matplotlib) inside `run`, so `paraplan --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from types import ModuleType

import paraplan
import paraplan.cli
from paraplan.core import ParaplanError

_NOT_COMMANDS = {"main", "common"}


def _commands() -> list[ModuleType]:
    modules = [
        importlib.import_module(f"paraplan.cli.{info.name}")
        for info in pkgutil.iter_modules(paraplan.cli.__path__)
        if info.name not in _NOT_COMMANDS and not info.name.startswith("_")
    ]
    return sorted(modules, key=lambda m: (m.ORDER, m.NAME))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="paraplan",
        description=(
            "How should this model be split over this cluster, and what speedup will it get? "
            "Each command is one stage of the workflow and also runs alone."
        ),
    )
    parser.add_argument("--version", action="version", version=f"paraplan {paraplan.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>", required=True)
    for module in _commands():
        cmd = sub.add_parser(
            module.NAME,
            help=module.HELP,
            description=(module.__doc__ or module.HELP).strip(),
            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        )
        module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except ParaplanError as exc:
        print(f"paraplan {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"paraplan {args.command}: interrupted; no partial output was kept", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
