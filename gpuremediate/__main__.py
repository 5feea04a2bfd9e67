import sys

from gpuremediate.cli import main

sys.exit(main())
