"""``python -m kvlab``: same as the ``kvlab`` console script."""

import sys

from kvlab.course.cli import main

sys.exit(main())
