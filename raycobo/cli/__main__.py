"""``python -m raycobo.cli``: the command line, as the ``raycobo`` script runs it."""

from raycobo.cli import main

main()
