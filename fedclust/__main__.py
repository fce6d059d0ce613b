import sys

from fedclust.cli import main

sys.exit(main())
