"""``python -m gradlint.runtime run|measure ...``: the runtime commands without the main CLI.

Useful under ``torchrun``, which launches modules: ``torchrun --nproc-per-node 2 -m gradlint.runtime run train.py``.
"""

import click

from gradlint.runtime.commands import measure_command, run_command


@click.group()
def main() -> None:
    """gradlint runtime: run a training loop to confirm findings and measure memory."""


main.add_command(run_command)
main.add_command(measure_command)

if __name__ == "__main__":
    main()
