"""Options and helpers shared by the stage commands: one vocabulary across stages
(`-o/--output`, `--plots DIR`, `--cluster NAME`, `--shapes NxG`, units in option names
such as `--timeout-s`), the help layout, old spellings kept for one release, and
tracking."""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from paraplan.core import ConfigError, ParaplanError

if TYPE_CHECKING:
    from paraplan.config_files import Kind, StudyStage


class ArgumentParser(argparse.ArgumentParser):
    """The dispatcher's and every command's parser: a bad command line (an unknown
    option, a value outside an option's choices, a missing value) is one line,
    `paraplan <command>: error: <message>`, with where the options are documented,
    not argparse's usage block before it."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions keep their line breaks (each example on its own line); an option's
    default is shown only when it says something (not None, empty, off or required).
    Option help wraps at spaces only, so a name such as `--kernel-ceilings` or
    `gpt-oss-120b` is never split at its hyphen."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "%(default)" in text
            or "default" in text.lower()
            or action.required
            or not action.option_strings
            or default is None
            or default is argparse.SUPPRESS
            or isinstance(default, bool)
            or default in ("", [], ())
        ):
            return text
        return f"{text} (default: %(default)s)"


def warn_deprecated(prog: str, old: str, new: str) -> None:
    from paraplan.typed import say_deprecated

    say_deprecated(f"{old} is deprecated, use {new}", prog)


def deprecated(parser, old: str | Sequence[str], new: str, dest: str, convert=None, flag: bool = False,
               const: object = True) -> None:
    """Accept `old` (hidden from --help) as `new`, storing into `dest`."""
    from paraplan.typed import deprecated_option

    deprecated_option(parser, old, new, dest, convert=convert, flag=flag, const=const)


def add_output_argument(parser, help: str, old: Sequence[str] = (), type=None) -> None:
    """`-o/--output` (required; checked after parsing so an old spelling also counts)."""
    from paraplan.cli._paths import output_path

    kind = type or output_path
    parser.add_argument("-o", "--output", type=kind, default=None, metavar="PATH", help=f"{help} (required)")
    for name in old:
        deprecated(parser, name, "-o/--output", "output", convert=kind)
    require(parser, "output", "-o/--output")


def require(parser: argparse.ArgumentParser, dest: str, spelling: str) -> None:
    """Mark an option required in a way old spellings satisfy (main checks it)."""
    required = list(parser.get_default("_required") or [])
    parser.set_defaults(_required=[*required, (dest, spelling)])


def missing_required(args: argparse.Namespace) -> str | None:
    for dest, spelling in getattr(args, "_required", []) or []:
        if getattr(args, dest, None) in (None, ""):
            return spelling
    return None


class MissingExtraError(ParaplanError):
    """A measuring command run where torch is not installed."""


def require_torch(what: str) -> None:
    """Measuring needs torch, which the `measure` extra brings; say how to get it."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise MissingExtraError(
            f"{what} needs torch: pip install 'paraplan[measure]' (CPU-only machines first: "
            "pip install torch --index-url https://download.pytorch.org/whl/cpu)") from None


def add_tracking_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("tracking (MLflow: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)")
    group.add_argument(
        "--no-track", action="store_true",
        help="run untracked: log nothing to MLflow (also PARAPLAN_TRACKING=off; "
             "workflow: config mlflow.enabled: false)",
    )
    group.add_argument("--rule", default="", help="Snakemake rule name, recorded as the run's 'rule' tag")
    group.add_argument("--wildcards", default="", help="Snakemake wildcards, recorded as the run's 'wildcards' tag")


def tracking_wanted(args: argparse.Namespace) -> bool:
    if not hasattr(args, "no_track") or args.no_track:
        return False
    from paraplan.track import tracking_enabled

    return tracking_enabled()


def open_tracking(args: argparse.Namespace):
    """The command's `PendingRun` (None when untracked): a record of its run in the
    spool, logged to MLflow after the command (docs/tracking.md); the command itself
    never imports mlflow and never waits for the store."""
    if not tracking_wanted(args):
        return None
    from paraplan.track_spool import PendingRun

    name = args.wildcards.replace(",", "/") if args.wildcards else args.command
    return PendingRun(tracking_stage(args), name, args.rule or args.command, args.wildcards, command=args.command)


KERNEL_KINDS = ("gemm", "attention", "kernels")


def tracking_stage(args: argparse.Namespace) -> str:
    """The stage a command's runs belong to (experiment `paraplan-<stage>`): the
    command, except `bench --kind gemm|attention` and `fit --kind kernels`, which
    make the kernels stage (workflow/rules/kernels.smk)."""
    return "kernels" if getattr(args, "kind", None) in KERNEL_KINDS else args.command


def track(args: argparse.Namespace, run) -> str | None:
    """Add a `paraplan.track.RunLog` to the command's run, once its result files are
    written; returns where it waits to be logged (None untracked)."""
    tracker = getattr(args, "_tracker", None)
    if tracker is None:
        return None
    where = tracker.log(run)
    print(f"paraplan {args.command}: MLflow run '{run.run_name}' recorded in {where} "
          f"(logged to {tracker.uri} {'at the end of the workflow' if tracker.by_workflow else 'in the background'})",
          file=sys.stderr)
    return where


def notes_tags(notes: Sequence[str]) -> dict[str, str]:
    """The notes and warnings a command printed as its MLflow run's description (the
    `mlflow.note.content` tag, which `mlflow ui` shows above the run's parameters)."""
    if not notes:
        return {}
    return {"mlflow.note.content": "paraplan's notes and warnings:\n\n" + "\n".join(f"- {n}" for n in notes)}


def int_list(text: str, key: str) -> list[int]:
    """`"2,4,8"` -> [2, 4, 8]; the error names the option."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(key, f"expected comma-separated integers, got '{text}'") from None
    if not values:
        raise ConfigError(key, "expected at least one value")
    return values


def name_list(text: str, key: str, allowed: tuple[str, ...]) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [n for n in names if n not in allowed]
    if unknown:
        raise ConfigError(key, f"unknown value '{unknown[0]}'; expected one of {', '.join(allowed)}")
    if not names:
        raise ConfigError(key, "expected at least one value")
    return names


def study_path(stage: StudyStage, name_or_path: str) -> Path:
    """The study file `--study` names; a name that is no study is a `ConfigError`
    listing the studies there are (a path that is no file: the reader's error)."""
    from paraplan.config_files import find_study, is_path, known_names

    path = find_study(stage, name_or_path)
    kind: Kind = "studies/simulate" if stage == "simulate" else "studies/plan"
    if path.is_file() or is_path(name_or_path, kind):
        return path
    known = known_names(kind)
    raise ConfigError("--study", f"no {stage} study named '{name_or_path}' ({path})"
                      + (f"; known: {', '.join(known)}" if known else ""))


def named_as_given(exc: ParaplanError, args: argparse.Namespace) -> ParaplanError:
    """`exc` in the user's words: the core names a value by its key (`cluster`,
    `seq_length`); when this command has that option (`--cluster`) and the user gave it
    (its value is not the default), the value came from the command line and the error
    names the option. Keys of files and of the workflow config are named where they
    are read (`paraplan.typed.Source`), so they never reach here as bare keys."""
    parser = getattr(args, "_parser", None)
    if not isinstance(exc, ConfigError) or exc.key.startswith("-") or parser is None:
        return exc
    option = "--" + exc.key.lower().replace("_", "-")
    action = parser._option_string_actions.get(option)
    if action is None or getattr(args, action.dest, action.default) == action.default:
        return exc
    return exc.as_option(option)
