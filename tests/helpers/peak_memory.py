"""``vanilla-transformer ...`` in this process, then its peak resident memory on standard error:
``peak RSS <kB> kB`` (Linux's ru_maxrss), for tests that bound a command's memory."""

import resource
import sys

from vanilla_transformer import cli

code = cli.main(sys.argv[1:])
print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss} kB", file=sys.stderr)
sys.exit(code)
