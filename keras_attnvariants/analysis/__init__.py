"""Analysis tools: interpretability metrics that need gradients."""

from keras_attnvariants.analysis.interpretability import (
    attention_importance as attention_importance,
)
from keras_attnvariants.analysis.interpretability import (
    gradient_importance as gradient_importance,
)
from keras_attnvariants.analysis.interpretability import (
    kendall_tau as kendall_tau,
)
