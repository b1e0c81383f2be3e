"""Training: the papers' recipes (:data:`~capsule_lib.train.recipes.registry.RECIPES`, one module per family), the loop
(:mod:`~capsule_lib.train.trainer`), what a run writes (:mod:`~capsule_lib.train.checkpoint`) and the one
entry point, :func:`train` (:mod:`~capsule_lib.train.run`), the speedrun (:mod:`~capsule_lib.train.timed`) and
the shipped checkpoints a run is exported to or starts from (:mod:`~capsule_lib.train.shipped`).

Layering: ``train/`` sits below :mod:`capsule_lib.pretrained` (which re-exports the shipped checkpoints' names for
their readers) and imports nothing from it, nor from :mod:`capsule_lib.notebook`. The commands ``python -m
capsule_lib.train`` and ``python -m capsule_lib.train.speedrun`` are ``capsule_lib.commands`` (the top layer);
``__main__.py`` and ``speedrun.py`` here are their entry modules, which hold nothing but the call.

The objectives a recipe trains with live with the losses (:mod:`capsule_lib.losses`), the loaders with the
data (:mod:`capsule_lib.data.loaders`, :class:`~capsule_lib.data.multimnist.MultiMNISTLoader`).
"""

from .checkpoint import History, RunMismatchError, load_history
from .recipes import RECIPES, Recipe, check_device_available, make_recipe, recipe_config
from .run import COMPILE_MODES, hardware_string, train
from .runtime import TrainingInterrupted, seed_everything, select_device
from .shipped import shipped_recipe
from .trainer import Trainer

__all__ = [
    "train",
    "shipped_recipe",
    "hardware_string",
    "COMPILE_MODES",
    "RECIPES",
    "Recipe",
    "make_recipe",
    "recipe_config",
    "check_device_available",
    "Trainer",
    "TrainingInterrupted",
    "seed_everything",
    "select_device",
    "History",
    "RunMismatchError",
    "load_history",
]
