"""``python -m attnlab.cli``: the same as ``attnlab``."""

from . import main

if __name__ == "__main__":  # pragma: no cover
    main()
