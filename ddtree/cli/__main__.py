import sys

from ddtree.cli import main

sys.exit(main())
