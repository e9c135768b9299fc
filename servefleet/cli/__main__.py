import sys

from servefleet.cli import main

sys.exit(main())
