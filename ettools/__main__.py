"""``python -m ettools``: the ``ettools`` command line."""

from ettools.cli import main

if __name__ == "__main__":
    main(prog_name="ettools")
