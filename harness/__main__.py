"""`python -m harness`: the same command line as `harness`."""

from harness.cli import main

main()
