"""The commands: ``python -m capsule_lib.train`` (:mod:`capsule_lib.commands.train`), ``python -m
capsule_lib.train.speedrun`` (:mod:`capsule_lib.commands.speedrun`) and ``python -m capsule_lib.predict``
(:mod:`capsule_lib.commands.predict`): each parses its arguments and calls the library.

Layering: the top layer of the library, above :mod:`capsule_lib.notebook` (whose
:func:`~capsule_lib.notebook.environment`, the one reader of ``CAPSULE_*``, gives the commands the defaults of
``--data-root`` and ``--offline``); nothing in the library imports it. The ``python -m`` spellings are entry modules
that hold nothing but the call of a command's ``main`` (``train/__main__.py``, ``train/speedrun.py``,
``predict.py``; ``tests/test_architecture.py`` checks both).
"""
