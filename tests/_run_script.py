"""Run the script ``sys.argv[1]`` as ``python SCRIPT ARGS`` would (tests/test_docs.py).

The target of the docs examples' zygote (tests/cli_runner.py ``Forks``): each example is a
script of its own, forked from one interpreter that imported aiocheckpoint once.
"""

import os
import runpy
import sys

if __name__ == "__main__":
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")
