"""Training: the papers' recipes (:data:`~capsule_lib.train.recipes.registry.RECIPES`, one module per family), the loop
(:mod:`~capsule_lib.train.trainer`), what a run writes (:mod:`~capsule_lib.train.checkpoint`) and the one
entry point, :func:`train` (:mod:`~capsule_lib.train.cli`; also ``python -m capsule_lib.train <recipe>``).

The objectives a recipe trains with live with the losses (:mod:`capsule_lib.losses`), the loaders with the
data (:mod:`capsule_lib.data.loaders`, :class:`~capsule_lib.data.multimnist.MultiMNISTLoader`).
"""

from .checkpoint import History, RunMismatchError, load_history
from .cli import COMPILE_MODES, hardware_string, main, shipped_recipe, train
from .recipes import RECIPES, Recipe, check_device_available, make_recipe, recipe_config
from .runtime import TrainingInterrupted, seed_everything, select_device
from .trainer import Trainer

__all__ = [
    "train",
    "shipped_recipe",
    "hardware_string",
    "main",
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
