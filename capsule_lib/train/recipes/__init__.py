"""The papers' training recipes: one dataclass per recipe, whose defaults are the paper's settings, one module per
family (``mnist``, ``viewpoints``, ``sequences``, ``cifar``, ``comparison``; what they share in ``base``), and
the speedrun recipes (``speedrun``: the same networks trained for accuracy per GPU minute).

A recipe says *what* to train (data, model, objective, optimiser, schedule, augmentation); the one entry point
that trains any of them is :func:`capsule_lib.train.run.train` (also the command line,
``python -m capsule_lib.train <recipe> --set key=value``). Recipes are looked up by name in :data:`RECIPES`
and built with overrides by :func:`make_recipe`; ``model.<field>`` overrides reach the model config.

=================================  ==========================================================================
name                               recipe
=================================  ==========================================================================
``capsnet``                        :class:`CapsNetRecipe` (Sabour et al. 2017, MNIST)
``baseline_cnn``                   :class:`BaselineCNNRecipe` (the CNN baseline on CapsNet's budget)
``efficient``                      :class:`EfficientCapsNetRecipe` (Mazzia et al. 2021, MNIST)
``efficient_multimnist``           :class:`EfficientMultiMNISTRecipe` (Mazzia et al. 2021, MultiMNIST pairs)
``capsnet_multimnist``             :class:`CapsNetMultiMNISTRecipe` (Sabour et al. 2017, MultiMNIST pairs)
``em_norb``                        :class:`EMNorbRecipe` (Hinton et al. 2018, smallNORB novel-viewpoint protocol)
``baseline_cnn_norb``              :class:`NorbCNNRecipe` (a CNN of EM's size, same protocol, data and budget)
``heinsen_norb``                   :class:`HeinsenNorbRecipe` (Heinsen 2019, same protocol, 48 x 48 full views)
``baseline_cnn_norb48``            :class:`NorbCNN48Recipe` (a CNN of Heinsen's size, same data and budget)
``heinsen_sequences``              :class:`HeinsenSequenceRecipe` (Heinsen's head on GENERATED token sequences)
``tsai_cifar10``                   :class:`TsaiCifarRecipe` (Tsai et al. 2020, CIFAR-10, the paper's recipe)
``tsai_cifar10_cpu``               :class:`TsaiCifarCPURecipe` (its CPU-sized variant, one-cycle schedule)
``baseline_backbone_cifar10_cpu``  :class:`BackboneCifarCPURecipe` (that variant's backbone + a linear head)
``routing_compare_mnist``          :class:`RoutingCompareRecipe` (one network, each routing, MNIST, equal time)
``routing_compare_norb``           :class:`RoutingCompareNorbRecipe` (the same on the viewpoint protocol)
``capsnet_speedrun``               :class:`CapsNetSpeedrun` (CapsNet for accuracy per GPU minute)
``baseline_cnn_speedrun``          :class:`BaselineCNNSpeedrun` (the CNN baseline on that pipeline)
``efficient_speedrun``             :class:`EfficientCapsNetSpeedrun` (Efficient-CapsNet, the same way)
``em_norb_speedrun``               :class:`EMNorbSpeedrun` (EM, paper-size, the viewpoint protocol)
``tsai_cifar10_speedrun``          :class:`TsaiCifarSpeedrun` (Tsai et al.'s CIFAR-10 network)
``capsnet_multimnist_speedrun``    :class:`CapsNetMultiMNISTSpeedrun` (CapsNet on MultiMNIST pairs)
=================================  ==========================================================================
"""

from . import base, cifar, comparison, mnist, registry, sequences, speedrun, viewpoints
from .base import *  # noqa: F403
from .cifar import *  # noqa: F403
from .comparison import *  # noqa: F403
from .mnist import *  # noqa: F403
from .registry import *  # noqa: F403
from .sequences import *  # noqa: F403
from .speedrun import *  # noqa: F403
from .viewpoints import *  # noqa: F403

# the package exports what its modules export, in the family order of the table above
__all__ = [
    *base.__all__,
    *mnist.__all__,
    *viewpoints.__all__,
    *sequences.__all__,
    *cifar.__all__,
    *comparison.__all__,
    *speedrun.__all__,
    *registry.__all__,
]
