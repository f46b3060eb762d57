"""`python -m rbroker` is the `rbroker` command."""

import sys

from rbroker.cli.main import main

sys.exit(main())
