"""`python -m zinc`: the same as the `zinc` command."""

from zinc.cli import main

main()
