"""``python -m fedshift.cli``: the ``fedshift`` command."""

from fedshift.cli import main

raise SystemExit(main())
