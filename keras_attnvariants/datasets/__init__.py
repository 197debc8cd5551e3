"""Synthetic generators and loaders for offline real data."""

from keras_attnvariants.datasets.arithmetic import (
    multiview_arithmetic as multiview_arithmetic,
)
from keras_attnvariants.datasets.arithmetic import tokenize as tokenize
from keras_attnvariants.datasets.stack_language import (
    stack_language as stack_language,
)
