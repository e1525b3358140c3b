"""``python -m attnlab`` (and ``torchrun ... -m attnlab train ...``): the command line."""

from .cli import main

if __name__ == "__main__":
    main()
