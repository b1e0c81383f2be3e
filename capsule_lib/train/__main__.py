"""``python -m capsule_lib.train <recipe> --set key=value`` (see :func:`capsule_lib.train.cli.main`)."""

from .cli import main

main()
