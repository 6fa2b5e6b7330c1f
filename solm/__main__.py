import sys

from solm.cli import main

sys.exit(main())
