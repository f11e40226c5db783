"""The `paraplan` dispatcher.

Every module in this package except `main` and `common` is a command: it defines
`NAME`, `HELP`, `ORDER` (position in `--help`), `add_arguments(parser)` and
`run(args) -> int`. Command modules import heavy packages (torch, mlflow,
matplotlib) inside `run`, so `paraplan --help` stays fast; `main` builds the options of
the command asked for only (`build_parser(only=...)`), so one command never pays for
importing what the others' options are made from.

The dispatcher opens the command's run record before the command runs (its start is
the job's), ends it when the command succeeds and marks it FAILED with the error when
the command fails; the record is logged to MLflow later, by another process
(`paraplan.track_spool`). This process never imports mlflow.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from types import ModuleType

import paraplan
import paraplan.cli
from paraplan.cli._paths import check_outputs_apart
from paraplan.cli.common import ArgumentParser, HelpFormatter, missing_required, named_as_given, open_tracking
from paraplan.core import ParaplanError

_NOT_COMMANDS = {"main", "common"}


def _commands() -> list[ModuleType]:
    modules = [
        importlib.import_module(f"paraplan.cli.{info.name}")
        for info in pkgutil.iter_modules(paraplan.cli.__path__)
        if info.name not in _NOT_COMMANDS and not info.name.startswith("_")
    ]
    return sorted(modules, key=lambda m: (m.ORDER, m.NAME))


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Every command with its options; with `only`, every command is listed (its
    one-line help) but only that one gets its options (`main`: the command asked for)."""
    parser = ArgumentParser(
        prog="paraplan",
        description=(
            "How should this model be split over this cluster, and what speedup will it get?\n"
            "Each command is one stage of the workflow and also runs alone;\n"
            "`paraplan <command> --help` documents its options."
        ),
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"paraplan {paraplan.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>", required=True)
    for module in _commands():
        cmd = sub.add_parser(
            module.NAME,
            help=module.HELP,
            description=(module.__doc__ or module.HELP).strip(),
            formatter_class=HelpFormatter,
        )
        if only in (None, module.NAME):
            module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run, _parser=cmd)
    return parser


def _command_asked(argv: list[str]) -> str:
    """The command in `argv`: its first word that is no option (the dispatcher's own
    options, -h and --version, take no value); "" when there is none."""
    return next((word for word in argv if not word.startswith("-")), "")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(only=_command_asked(sys.argv[1:] if argv is None else argv))
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # named by the command's parser, which knows the options it lacks
        args._parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    missing = missing_required(args)
    if missing:
        args._parser.error(f"the following arguments are required: {missing}")
    tracker = None
    try:
        tracker = open_tracking(args)
        args._tracker = tracker
        check_outputs_apart(args)  # an output that would replace one of the inputs
        code = int(args._run(args) or 0)
        if tracker is not None and code == 0:
            tracker.close()
    except ParaplanError as raised:
        exc = named_as_given(raised, args)
        _failed(tracker, str(exc))
        print(f"paraplan {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.filename is None:
            _failed(tracker, f"{type(exc).__name__}: {exc}")
            raise
        # a path the system refuses (a name too long, a folder in the way) where no
        # reader or writer expected it: one line naming it, as for every other input
        message = f"cannot use '{exc.filename}': {exc.strerror or exc}"
        _failed(tracker, message)
        print(f"paraplan {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        _failed(tracker, "interrupted (Ctrl-C or SIGTERM)")
        print(f"paraplan {args.command}: interrupted; no partial output was kept", file=sys.stderr)
        return 130
    except BaseException as exc:
        _failed(tracker, f"{type(exc).__name__}: {exc}")
        raise
    if code != 0:
        _failed(tracker, f"exit status {code}")
    return code


def _failed(tracker, error: str) -> None:
    if tracker is None:
        return
    where = tracker.fail(error)
    if where:
        print(f"paraplan: MLflow run marked FAILED (recorded in {where})", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
