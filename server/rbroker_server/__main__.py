"""`python -m rbroker_server` runs the `rbroker-server` command."""

import sys

from rbroker_server.cli.main import main

sys.exit(main())
