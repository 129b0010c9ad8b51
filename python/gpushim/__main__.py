"""python -m gpushim ARGS: the gpushim command."""

import sys

from gpushim import main

sys.exit(main())
