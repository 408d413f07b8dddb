"""``python -m ettools.cli``: the ``ettools`` command line (as ``python -m ettools``)."""

from ettools.cli import main

if __name__ == "__main__":
    main()
