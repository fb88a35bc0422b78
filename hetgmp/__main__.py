import sys

from hetgmp.cli import main

sys.exit(main())
