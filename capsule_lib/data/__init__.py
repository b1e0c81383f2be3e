"""Datasets (real and generated), loaders and transforms behind one ``get_dataset`` entry point."""
from . import generated  # noqa: F401  (registers the generated datasets)
from .datasets import (DatasetUnavailableError, ImageDataset, available_datasets, data_root, get_dataset,
                       is_offline, read_idx, register_dataset, train_val_indices)
from .generated import glyph_digits

__all__ = [
    "DatasetUnavailableError", "ImageDataset", "available_datasets", "data_root", "get_dataset", "is_offline",
    "read_idx", "register_dataset", "train_val_indices", "glyph_digits",
]
