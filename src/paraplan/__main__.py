"""`python -m paraplan` runs the `paraplan` command."""

import sys

from paraplan.cli.main import main

sys.exit(main())
