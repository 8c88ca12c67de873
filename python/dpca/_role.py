"""``python -m dpca._role proxy|owner ARGS``: the proxy and owner programs, run from
the extension, so that a study started from Python runs its parties as processes
of their own without separate binaries."""

import sys

from . import _native


def main() -> int:
    if len(sys.argv) < 2:
        print("usage: python -m dpca._role proxy|owner [ARGS...]", file=sys.stderr)
        return 2
    return _native.role_main(sys.argv[1], sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
