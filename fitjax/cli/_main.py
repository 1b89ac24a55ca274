"""The `fitjax` console command: `fitjax fit|validate|test|predict ...` or `fitjax launch ...`."""

from __future__ import annotations

import os
import sys

from fitjax.loop import DEBUG_VAR, exit_quietly_on_ctrl_c

__all__ = ["main"]

_DESCRIPTION = ("fitjax command line tool. Name the module with --model.class_path (and the data with "
                "--data.class_path). `fitjax launch --help`: start several processes on this machine.")


def main(argv: list[str] | None = None) -> None:
    """Runs the `fitjax` console command with `argv` (default `sys.argv[1:]`); exits with its status.

    `fitjax launch ...` starts processes (`fitjax.cli.launch`, no jsonargparse needed); anything
    else is `LightningCLI()` with every class named by `class_path`. Ctrl-C ends it with one line
    and status 130; `--debug` (or `FITJAX_DEBUG=1`) adds the traceback.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] != ["launch"] and "--debug" in argv:  # LightningCLI takes the flag: errors' tracebacks
        os.environ[DEBUG_VAR] = "1"  # and Ctrl-C's (`Trainer.fit`)
    if argv and argv[0] == "launch":
        from fitjax.cli._launch import launch

        sys.exit(launch(argv[1:]))
    # Like `python -m`, the working directory is importable: `--model.class_path mypkg.MyModule`.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        from fitjax.cli._cli import LightningCLI
    except ModuleNotFoundError as exc:
        if exc.name != "jsonargparse":
            raise
        command = argv[0] if argv and not argv[0].startswith("-") else "fit|validate|test|predict|plan"
        sys.exit(f"fitjax {command} reads configs with jsonargparse, which is not installed here.\n"
                 "Install the CLI extra: pip install 'fitjax[cli]'   (or: pip install -e '.[cli]' in a checkout)")
    exit_quietly_on_ctrl_c(
        lambda: LightningCLI(args=argv, parser_kwargs={"prog": "fitjax", "description": _DESCRIPTION}))
