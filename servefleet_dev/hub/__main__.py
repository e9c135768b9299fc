import sys

from servefleet_dev.cli.hub import main

sys.exit(main())
