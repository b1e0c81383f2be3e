"""Datasets (real and generated), loaders and transforms behind one ``get_dataset`` entry point.

Registered names: ``mnist``, ``fashion_mnist``, ``cifar10``, ``cifar100``, ``smallnorb``, ``affnist`` (real,
under the data root; fetch with ``python data_scripts/<name>.py --root DIR``) and the GENERATED sets
``glyph_digits``, ``multimnist`` (``variant="sabour" | "efficient"``), ``affine_mnist`` and
``rendered_norb`` (a smallNORB-like set ray-cast offline), ``colour_shapes`` (RGB shapes, the CIFAR-10 stand-in). See ``book/appendix/data.ipynb`` for samples.
"""
from . import generated  # noqa: F401  (registers the generated datasets)
from . import affine_mnist, affnist, multimnist, render, smallnorb  # noqa: F401  (register their datasets)
from .affine_mnist import make_affine_mnist
from .affnist import center_pad, random_place, read_affnist_mat
from .datasets import (DatasetUnavailableError, ImageDataset, available_datasets, data_root, get_dataset, repository_root,
                       STANDINS, DataSource, read_idx, register_dataset, train_val_indices)
from .files import RealData, find_real_data
from .generated import colour_shapes, glyph_digits
from .images import ImageFacts, ImageSource, image_facts, register_images
from .loaders import TensorLoader
from .multimnist import MultiMNISTLoader, make_multimnist, overlap_stats
from .render import render_norb_like, viewpoint_split
from .smallnorb import (EfficientNorbTransform, NorbFormatError, channel_stats, heinsen_transform, hinton_transform,
                        read_norb_matrix, stereo_as_samples, write_norb_matrix)

__all__ = [
    "DatasetUnavailableError", "ImageDataset", "available_datasets", "data_root", "repository_root", "get_dataset",
    "DataSource", "find_real_data", "RealData",
    "read_idx", "register_dataset", "train_val_indices", "STANDINS", "glyph_digits", "colour_shapes",
    "ImageSource", "ImageFacts", "image_facts", "register_images",
    "TensorLoader", "MultiMNISTLoader", "make_multimnist", "overlap_stats", "make_affine_mnist", "read_affnist_mat", "center_pad", "random_place",
    "render_norb_like", "viewpoint_split", "read_norb_matrix", "write_norb_matrix", "NorbFormatError",
    "heinsen_transform", "EfficientNorbTransform", "hinton_transform", "channel_stats", "stereo_as_samples",
]
