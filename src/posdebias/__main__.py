"""``python -m posdebias`` (also what ``accelerate launch -m posdebias`` runs)."""

import sys

from posdebias.cli import main

sys.exit(main())
