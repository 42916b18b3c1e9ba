"""`python -m ncclforensics` entry point."""

from ncclforensics.cli import main

main()
