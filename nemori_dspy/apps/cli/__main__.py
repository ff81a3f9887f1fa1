"""``python -m nemori_dspy.apps.cli``: the ``nemori-dspy`` command."""

import sys

from nemori_dspy.apps.cli import main

sys.exit(main())
