"""``python -m sweep``: the command line (see :mod:`sweep.cli`).

With no arguments it runs the main job: the built-in default sweep, the best
layouts, and the cube written to ``default_cube.nc``.
"""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m sweep"))
