"""Configurations between Hugging Face Marian and transduce (``transduce.export.huggingface``):
Marian's ``config.json`` checked and turned into a ``ModelConfig``, a transduce model checked and
turned into a ``MarianConfig`` and a ``GenerationConfig``. What one side cannot represent is a
one-line UserError naming the field."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, cast

from transduce.config import Config, ModelConfig
from transduce.data.vocab import BOS, EOS, PAD
from transduce.errors import UserError
from transduce.model.transformer import Transformer

__all__ = [
    "ALPHA_KEY",
    "OFFSET_KEY",
    "check_exportable",
    "check_marian_config",
    "generation_config",
    "marian_config",
    "model_config",
    "quiet_transformers",
    "transformers_module",
]

# generation_config.json's key for transduce's GNMT alpha, which Hugging Face's length_penalty
# is not (transduce.export.huggingface): an export writes it, an import reads it back
ALPHA_KEY = "transduce_alpha"
OFFSET_KEY = "transduce_max_len_offset"  # the output length cap past the source's
Activation = Literal["relu", "swish", "gelu"]  # ModelConfig.activation
# Marian's activation_function -> ModelConfig.activation, and back
ACTIVATIONS = {"swish": "swish", "silu": "swish", "gelu": "gelu", "relu": "relu"}
MARIAN_ACTIVATIONS = {"swish": "swish", "gelu": "gelu", "relu": "relu"}
# config.json fields some Marian conversions carry that transduce has no place for, when true
REFUSED_TRUE = {
    "normalize_before": "pre-norm layers",
    "normalize_embedding": "a layer norm on the embeddings",
    "layernorm_embedding": "a layer norm on the embeddings",
    "add_final_layer_norm": "a final layer norm",
    "add_bias_logits": "a second logits bias",
}


def transformers_module() -> Any:
    try:
        import transformers
    except ImportError:
        raise UserError(
            "Hugging Face models need the transformers package: pip install 'transduce[hf]'"
        ) from None
    return transformers


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' progress bars and log below errors off (a load report or a bar for one
    shard is noise on a command's stderr, where an error must be one line), then as before."""
    hf_logging = transformers_module().utils.logging
    shown, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if shown:
            hf_logging.enable_progress_bar()


def check_marian_config(c: dict[str, Any], where: Path) -> None:
    """One-line UserErrors naming the first config.json field transduce cannot represent."""
    if c.get("model_type") != "marian":
        raise UserError(f"{where}: model_type is {c.get('model_type')!r}; transduce imports marian")
    for key in (
        "d_model",
        "vocab_size",
        "encoder_layers",
        "encoder_ffn_dim",
        "encoder_attention_heads",
    ):
        value = c.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise UserError(f"{where}: {key} must be a positive integer; got {value!r}")
    for key, what in REFUSED_TRUE.items():
        if c.get(key):
            raise UserError(f"{where}: {key} is set ({what}); transduce cannot represent it")
    if c.get("static_position_embeddings", True) is not True:
        raise UserError(
            f"{where}: static_position_embeddings is false (learned positions); "
            "transduce imports Marian's sinusoids only"
        )
    if c.get("scale_embedding") is not True:
        raise UserError(
            f"{where}: scale_embedding is not true; transduce's embeddings are "
            "always scaled by sqrt(d_model)"
        )
    for enc, dec in (
        ("encoder_layers", "decoder_layers"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
        ("encoder_attention_heads", "decoder_attention_heads"),
    ):
        if c.get(enc) != c.get(dec):
            raise UserError(
                f"{where}: {enc} ({c.get(enc)}) differs from {dec} ({c.get(dec)}); "
                "transduce's encoder and decoder have one shape"
            )
    activation = c.get("activation_function")
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise UserError(
            f"{where}: activation_function {c.get('activation_function')!r}; "
            f"transduce has {', '.join(ACTIVATIONS)}"
        )
    d_model, heads = c.get("d_model"), c.get("encoder_attention_heads")
    if not isinstance(d_model, int) or d_model % 2 or not isinstance(heads, int) or d_model % heads:
        raise UserError(
            f"{where}: d_model {d_model} must be even and a multiple of "
            f"encoder_attention_heads ({heads})"
        )
    if isinstance(c.get("eos_token_id"), list):
        raise UserError(f"{where}: eos_token_id is a list; transduce has one EOS")
    for key in ("dropout", "attention_dropout", "activation_dropout"):
        value = c.get(key, 0.0)
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise UserError(f"{where}: {key} must be a number; got {value!r}")
    for key in ("tie_word_embeddings", "share_encoder_decoder_embeddings"):
        if not isinstance(c.get(key, True), bool):
            raise UserError(f"{where}: {key} must be true or false; got {c.get(key)!r}")
    # two vocabularies: the decoder's size (None or absent: vocab_size's)
    size = c.get("decoder_vocab_size")
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size <= 0):
        raise UserError(f"{where}: decoder_vocab_size must be a positive integer; got {size!r}")


def model_config(c: dict[str, Any], where: Path | str = "config.json") -> ModelConfig:
    """transduce's ModelConfig of Marian's config.json ``c`` (checked first by
    ``check_marian_config``); a value ModelConfig refuses is a UserError naming ``where``."""
    d_model, heads = c["d_model"], c["encoder_attention_heads"]
    try:
        return ModelConfig(
            n_layers=c["encoder_layers"],
            d_model=d_model,
            d_ff=c["encoder_ffn_dim"],
            n_heads=heads,
            d_k=d_model // heads,
            d_v=d_model // heads,
            dropout=float(c.get("dropout", 0.1)),
            attention_dropout=float(c.get("attention_dropout", 0.0)),
            activation_dropout=float(c.get("activation_dropout", 0.0)),
            positional="sinusoidal",
            max_positions=c.get("max_position_embeddings", 1024),
            norm="post",
            tie_embeddings=bool(c.get("tie_word_embeddings", True)),
            activation=cast(Activation, ACTIVATIONS[c["activation_function"]]),
            output_bias=True,
        )
    except UserError as e:
        raise UserError(f"{where}: {e}") from None


def check_exportable(model: object, cfg: Config, path: Path) -> Transformer:
    """The model as a Transformer Marian can represent, or a one-line UserError naming why."""
    m = cfg.model
    if not isinstance(model, Transformer):
        raise UserError(
            f"{path}: Marian is a Transformer; this is the {m.architecture!r} baseline "
            "(model.architecture)"
        )
    refusals = (
        (m.norm != "post", f"model.norm is {m.norm!r}; Marian's layers are post-norm"),
        (m.positional != "sinusoidal", "model.positional is 'learned'; Marian has sinusoids"),
        (m.position_unit != "token", "model.position_unit is 'word'; Marian counts tokens"),
        (
            m.d_k != m.d_v or m.d_k * m.n_heads != m.d_model,
            f"model.d_k/d_v ({m.d_k}/{m.d_v}) must be d_model / n_heads ({m.d_model}/{m.n_heads})",
        ),
        (m.d_model % 2 == 1, f"model.d_model ({m.d_model}) must be even"),
    )
    for refused, why in refusals:
        if refused:
            raise UserError(f"{path}: cannot export to Marian: {why}")
    return model


def marian_config(cfg: Config, src: int, tgt: int, share: bool) -> Any:
    """The ``MarianConfig`` of a model of ``cfg`` with ``src`` / ``tgt`` ids (``share``: one
    embedding matrix for the encoder and the decoder)."""
    m = cfg.model
    return transformers_module().MarianConfig(
        vocab_size=src,
        decoder_vocab_size=tgt,
        d_model=m.d_model,
        encoder_layers=m.n_layers,
        decoder_layers=m.n_layers,
        encoder_ffn_dim=m.d_ff,
        decoder_ffn_dim=m.d_ff,
        encoder_attention_heads=m.n_heads,
        decoder_attention_heads=m.n_heads,
        activation_function=MARIAN_ACTIVATIONS[m.activation],
        dropout=m.dropout,
        attention_dropout=m.attention_dropout,
        activation_dropout=m.activation_dropout,
        max_position_embeddings=m.max_positions,
        scale_embedding=True,
        pad_token_id=PAD,
        eos_token_id=EOS,
        decoder_start_token_id=BOS,
        forced_eos_token_id=EOS,
        share_encoder_decoder_embeddings=share,
        tie_word_embeddings=m.tie_embeddings,
    )


def generation_config(cfg: Config) -> Any:
    """The ``GenerationConfig``: transduce's ids and decoding defaults (see the module
    docstring of ``transduce.export.huggingface`` for the length penalty)."""
    d = cfg.decode
    options: dict[str, Any] = {
        "decoder_start_token_id": BOS,
        "eos_token_id": EOS,
        "pad_token_id": PAD,
        "forced_eos_token_id": EOS,
        "bad_words_ids": [[PAD], [BOS]],  # never generated
        "max_length": cfg.model.max_positions,
        "num_beams": d.beam,
        ALPHA_KEY: d.alpha,  # unread by Hugging Face; transduce's import takes it back
        OFFSET_KEY: d.max_len_offset,  # likewise
    }
    if d.beam > 1:  # Hugging Face warns of a length penalty without a beam
        options["length_penalty"] = d.alpha
    return transformers_module().GenerationConfig(**options)
