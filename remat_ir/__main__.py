"""`python -m remat_ir` is the `remat-ir` command."""

import sys

from .cli import main

sys.exit(main())
