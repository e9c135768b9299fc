import sys

from servefleet_dev.hub import main

sys.exit(main())
