"""``python -m ragen.cli`` = the ``ragen`` console script."""

from ragen.cli import main

raise SystemExit(main())
