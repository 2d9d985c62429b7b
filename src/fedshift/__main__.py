import sys

from fedshift.cli import main

sys.exit(main())
