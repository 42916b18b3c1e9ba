"""`python -m ncclforensics` entry point."""

from ncclforensics.cli import run

run()
