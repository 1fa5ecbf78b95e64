"""``python -m limitflow``, and the ``limitflow`` console script."""

import sys


def main() -> int:
    """The command line. For ``run``, its stop signals are caught before the rest of
    limitflow is imported (see ``limitflow.stopping``): a SIGTERM right after the start
    is a clean stop; and they are not restored: once the run is over they are ignored
    until the process has ended, with the exit code the run decided, as after a replay."""
    if sys.argv[1:2] == ["run"]:
        from limitflow.stopping import StopSignals

        StopSignals.install()
    from limitflow.cli import main as cli_main

    return cli_main(console=True)


if __name__ == "__main__":
    sys.exit(main())
