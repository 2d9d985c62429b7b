"""``python -m fedshift.cli``: the same as the ``fedshift`` console script."""

import sys

from fedshift.cli import main

sys.exit(main())
