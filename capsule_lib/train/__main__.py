"""``python -m capsule_lib.train <recipe> --set key=value`` (see :func:`capsule_lib.train.cli.main`): the command
line with the defaults of ``--data-root`` and ``--offline`` from the environment (``CAPSULE_DATA``,
``CAPSULE_OFFLINE``), read by :func:`capsule_lib.notebook.environment`, the one reader of ``CAPSULE_*``.

Layering: a command, the top of the library (above :mod:`capsule_lib.notebook`; nothing imports it). Its path is
fixed by ``python -m capsule_lib.train``; the rest of ``train/`` sits below :mod:`capsule_lib.pretrained` and
:mod:`capsule_lib.notebook` (``tests/test_architecture.py``)."""

from ..notebook import environment
from .cli import main

env = environment()
main(data_root=env.data_root, offline=env.offline)
