"""``python -m raycobo`` = the ``raycobo`` command (for environments without the entry point)."""

from raycobo.cli import main

main()
