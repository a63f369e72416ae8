"""``python -m fedshift``: the ``fedshift`` command (as ``python -m fedshift.cli``).

``python -m`` puts the working directory first on ``sys.path``; it is taken off again, so a
module lying there is never imported by an import path, just as under the installed script.
"""

import os
import sys

if not sys.flags.safe_path and sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from fedshift.cli import main  # noqa: E402 - after the working directory left sys.path

raise SystemExit(main())
