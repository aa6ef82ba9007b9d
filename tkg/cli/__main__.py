"""`python -m tkg.cli`: the `tkg` command."""

import sys

from tkg.cli import app

sys.exit(app())
