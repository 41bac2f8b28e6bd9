"""``python -m statefun``: the same as the ``statefun`` command."""

from statefun._cli import main

raise SystemExit(main())
