"""`python -m ftpull ...` is `ft ...`."""

from .cli import main

main()
