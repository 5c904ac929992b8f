"""Data: dataset sources, deterministic splits, and the batch/augmentation pipeline."""

from dpkd_jax.data.arrays import ArrayDataset
from dpkd_jax.data.arrays import DatasetInfo
from dpkd_jax.data.arrays import FeatureDataset
from dpkd_jax.data.pipeline import augment
from dpkd_jax.data.pipeline import denormalize
from dpkd_jax.data.pipeline import epoch_batches
from dpkd_jax.data.pipeline import iterate
from dpkd_jax.data.pipeline import model_inputs
from dpkd_jax.data.pipeline import normalize
from dpkd_jax.data.pipeline import poisson_batch
from dpkd_jax.data.pipeline import random_translate
from dpkd_jax.data.pipeline import suggested_max_batch_size
from dpkd_jax.data.sources import check_available
from dpkd_jax.data.sources import clear_cache
from dpkd_jax.data.sources import DATA_DIR_ENV_VAR
from dpkd_jax.data.sources import DataNotFoundError
from dpkd_jax.data.sources import DATASETS
from dpkd_jax.data.sources import load
from dpkd_jax.data.sources import PREPROCESSING
from dpkd_jax.data.splits import partition
from dpkd_jax.data.splits import private_public_split
from dpkd_jax.data.splits import shard_dataset
from dpkd_jax.data.splits import shard_indices
from dpkd_jax.data.splits import split_dataset
from dpkd_jax.data.splits import stratified_partition

__all__ = [
    "ArrayDataset",
    "DATASETS",
    "DATA_DIR_ENV_VAR",
    "DataNotFoundError",
    "PREPROCESSING",
    "DatasetInfo",
    "FeatureDataset",
    "augment",
    "check_available",
    "clear_cache",
    "denormalize",
    "epoch_batches",
    "iterate",
    "load",
    "model_inputs",
    "normalize",
    "partition",
    "poisson_batch",
    "random_translate",
    "private_public_split",
    "shard_dataset",
    "shard_indices",
    "split_dataset",
    "stratified_partition",
    "suggested_max_batch_size",
]
