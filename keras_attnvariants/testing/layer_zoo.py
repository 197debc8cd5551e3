"""One tiny configuration of every public layer, shared by the scale-out
tests (tf.distribute, JAX data parallel, XLA + mixed_bfloat16) and the
golden artifacts."""

import keras
from keras import ops

import keras_attnvariants as kav
from keras_attnvariants.losses.attention_loss import AttentionLoss
from keras_attnvariants.losses.attention_loss import batch_mean

LENGTH, VOCAB, DIM = 6, 11, 8


@keras.saving.register_keras_serializable(package="keras_attnvariants_test")
class WeightSquareLoss(AttentionLoss):
    """Batch mean of the squared attention weights (a deterministic term;
    `batch_mean`: 0 on a replica without examples, where `ops.mean` is
    NaN)."""

    def compute_loss_value(self, attention_weights):
        per_example = ops.sum(ops.square(attention_weights), axis=(1, 2, 3))
        return 0.1 * batch_mean(per_example)

    def from_attention(self, context):
        return self(context["attention_weights"])


def _guidance():
    return kav.AttentionGuidanceRegularizer(
        {0: "next", 1: "first"}, alpha=1.0, decay_steps=8, name="guidance"
    )


# name -> factory of the attention layer; `deterministic` variants must give
# identical loss histories on one device and under MirroredStrategy.
LAYERS = {
    "doubly_normalized_attention": lambda: kav.DoublyNormalizedAttention(
        2, 4, iterations=2
    ),
    "hybrid_attention": lambda: kav.HybridAttention(2, 4, hybrid_init=0.3),
    "dnas_with_attention_loss": lambda: kav.DoublyNormalizedAttention(
        2, 4, attention_losses=[WeightSquareLoss(name="weight_square")]
    ),
    "gumbel_discrete_attention": lambda: kav.GumbelDiscreteAttention(
        2, 4, seed=3
    ),
    "dnas_with_guidance": lambda: kav.DoublyNormalizedAttention(
        2, 4, attention_losses=[_guidance()]
    ),
    "hnas_with_kq_ct": lambda: kav.HybridAttention(
        2, 4, attention_losses=[kav.KQAlignment("ct", name="kq_ct")]
    ),
    "hnas_with_kq_gan": lambda: kav.HybridAttention(
        2, 4, attention_losses=[kav.KQAlignment("gan", name="kq_gan")]
    ),
    "hnas_with_kq_ot": lambda: kav.HybridAttention(
        2, 4, attention_losses=[kav.KQAlignment("ot", name="kq_ot")]
    ),
    "hnas_with_kq_mmd": lambda: kav.HybridAttention(
        2, 4, attention_losses=[kav.KQAlignment("mmd", name="kq_mmd")]
    ),
    # The reference-code parity and non-saturating options.
    "hnas_with_kq_gan_per_head": lambda: kav.HybridAttention(
        2,
        4,
        attention_losses=[
            kav.KQAlignment(
                "gan",
                gan_loss="non_saturating",
                adversary_per_head=True,
                name="kq_gan_per_head",
            )
        ],
    ),
    "hnas_with_guidance": lambda: kav.HybridAttention(
        2, 4, attention_losses=[_guidance()]
    ),
    "gumbel_with_guidance": lambda: kav.GumbelDiscreteAttention(
        2, 4, seed=3, attention_losses=[_guidance()]
    ),
}
# Encoders that take the token ids themselves.
ENCODERS = {
    "two_stream_encoder": lambda: kav.TwoStreamEncoder(
        vocab_size=VOCAB,
        max_length=LENGTH,
        num_layers=2,
        d_model=DIM,
        num_heads=2,
        d_ff=16,
        receptive_field_coefficient=0.1,
        seed=3,
    ),
}
LAYERS.update(ENCODERS)
# Gumbel noise differs per replica by design.
DETERMINISTIC = set(LAYERS) - {
    "gumbel_discrete_attention",
    "gumbel_with_guidance",
    "two_stream_encoder",
}
# Artifacts of saved_models/: zoo models plus the converted keras-hub BERT.
CONVERTED_BACKBONE = "converted_bert_backbone"
GOLDEN = (
    "doubly_normalized_attention",
    "hybrid_attention",
    "gumbel_discrete_attention",
    "two_stream_encoder",
)


def build_model(name, dtype=None):
    """Seeded functional model: embedding (mask_zero) -> layer -> dense
    (encoders of `ENCODERS` embed the token ids themselves)."""
    keras.utils.set_random_seed(1)
    tokens = keras.Input((LENGTH,), dtype="int32", name="tokens")
    if name not in ENCODERS:
        x = keras.layers.Embedding(VOCAB, DIM, mask_zero=True, dtype=dtype)(
            tokens
        )
    layer = LAYERS[name]()
    if dtype is not None:
        layer = type(layer).from_config({**layer.get_config(), "dtype": dtype})
    x = layer(tokens) if name in ENCODERS else x + layer(x, x)
    x = keras.layers.GlobalAveragePooling1D(dtype=dtype)(x)
    outputs = keras.layers.Dense(3, name="head", dtype="float32")(x)
    return keras.Model({"tokens": tokens}, outputs, name=name)


def training_data(num=32, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, VOCAB, size=(num, LENGTH)).astype("int32")
    tokens[:, 4:] *= rng.random((num, 1)) < 0.5  # padding on half the rows
    targets = rng.normal(size=(num, 3)).astype("float32")
    return {"tokens": tokens}, targets


def build_converted_backbone():
    """A small random keras-hub BERT converted to HNAS, in a functional
    model returning its sequence output (needs keras-hub)."""
    from keras_attnvariants.backbones import convert_backbone
    from keras_attnvariants.backbones.pretrained import random_bert

    backbone = random_bert(VOCAB, LENGTH, seed=1)
    converted = convert_backbone(backbone, kav.HybridAttention, hybrid_init=0.3)
    inputs = {
        "token_ids": keras.Input((LENGTH,), dtype="int32", name="token_ids"),
        "padding_mask": keras.Input(
            (LENGTH,), dtype="int32", name="padding_mask"
        ),
        "segment_ids": keras.Input(
            (LENGTH,), dtype="int32", name="segment_ids"
        ),
    }
    outputs = converted(inputs)["sequence_output"]
    return keras.Model(inputs, outputs, name="converted_bert")


def backbone_inputs():
    tokens = training_data(num=2, seed=0)[0]["tokens"]
    return {
        "token_ids": tokens,
        "padding_mask": (tokens != 0).astype("int32"),
        "segment_ids": (tokens * 0).astype("int32"),
    }
