import sys

from gpuplace.cli import main

sys.exit(main())
