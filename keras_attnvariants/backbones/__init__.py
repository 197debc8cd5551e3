"""keras-hub backbones with this package's attention (optional extra).

Importing this package does not import keras_hub; the functions import it
when called and raise `ImportError` with the install command if it is
missing. Importing it registers the deserializer of converted backbones, so
their `.keras` files reload with `keras.saving.load_model`.
"""

from keras_attnvariants.backbones.attention_weights import (
    attention_weights as attention_weights,
)
from keras_attnvariants.backbones.attention_weights import (
    hybrid_weights as hybrid_weights,
)
from keras_attnvariants.backbones.conversion import (
    ConvertedBackbone as ConvertedBackbone,
)
from keras_attnvariants.backbones.conversion import (
    convert_backbone as convert_backbone,
)
from keras_attnvariants.backbones.conversion import (
    self_attention_layers as self_attention_layers,
)
from keras_attnvariants.backbones.pretrained import first_layers as first_layers
from keras_attnvariants.backbones.pretrained import load_minilm as load_minilm
from keras_attnvariants.backbones.pretrained import random_bert as random_bert
