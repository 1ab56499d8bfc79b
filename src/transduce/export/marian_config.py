"""Configurations between Hugging Face Marian and transduce (``transduce.export.huggingface``):
Marian's ``config.json`` checked and turned into a ``ModelConfig``, a transduce model checked and
turned into a ``MarianConfig`` and a ``GenerationConfig``. What one side cannot represent is a
one-line UserError naming the field."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, cast

from transduce.config import Config, DecodeConfig, ModelConfig
from transduce.data.vocab import BOS, EOS, PAD
from transduce.errors import UserError
from transduce.export.positions import exported_positions
from transduce.model.transformer import Transformer

__all__ = [
    "ALPHA_KEY",
    "OFFSET_KEY",
    "check_exportable",
    "check_marian_config",
    "decode_config",
    "generation_config",
    "with_generation_ids",
    "marian_config",
    "model_config",
    "quiet_transformers",
    "generation_in_config",
    "transformers_module",
]

# generation_config.json's key for transduce's GNMT alpha, which Hugging Face's length_penalty
# is not (transduce.export.huggingface): an export writes it, an import reads it back
ALPHA_KEY = "transduce_alpha"
OFFSET_KEY = "transduce_max_len_offset"  # the output length cap past the source's
SEED_KEY = "transduce_sampling_seed"  # a sampling model's seed: Hugging Face has no place for it
# generation_config.json settings transduce's decoding has no counterpart for, with the values
# that leave generate's outputs as transduce's (unset, or its default): another is refused on
# import, naming the setting, since generate's outputs would differ from the import's
GENERATION_NO_OPS: dict[str, tuple[Any, ...]] = {
    "no_repeat_ngram_size": (None, 0),
    "encoder_no_repeat_ngram_size": (None, 0),
    "repetition_penalty": (None, 1.0),
    "encoder_repetition_penalty": (None, 1.0),
    "min_length": (None, 0),
    "min_new_tokens": (None, 0),
    "forced_bos_token_id": (None,),
    "num_beam_groups": (None, 1),
    "diversity_penalty": (None, 0.0),
    "suppress_tokens": (None, []),
    "begin_suppress_tokens": (None, []),
    "typical_p": (None, 1.0),
    "epsilon_cutoff": (None, 0.0),
    "eta_cutoff": (None, 0.0),
    "min_p": (None, 0.0),
    "exponential_decay_length_penalty": (None,),
    "sequence_bias": (None, {}),
    "force_words_ids": (None, []),
    "penalty_alpha": (None, 0.0),
    "guidance_scale": (None, 1.0),
    "num_return_sequences": (None, 1),
    "max_new_tokens": (None,),  # a cap of its own: transduce's is the source's length + offset
    "stop_strings": (None,),
    "constraints": (None,),
    "top_h": (None,),
    "watermarking_config": (None,),
}
# Hugging Face's sampling defaults, where generation_config.json leaves them unset
HF_SAMPLING_DEFAULTS = {"temperature": 1.0, "top_k": 50, "top_p": 1.0}
Activation = Literal["relu", "swish", "gelu"]  # ModelConfig.activation
# Marian's activation_function -> ModelConfig.activation, and back
ACTIVATIONS = {"swish": "swish", "silu": "swish", "gelu": "gelu", "relu": "relu"}
MARIAN_ACTIVATIONS = {"swish": "swish", "gelu": "gelu", "relu": "relu"}
# config.json fields some Marian conversions carry that transduce has no place for, when true
# why REFUSED_TRUE's settings are refused: transformers reads none of them, so its outputs are
# a post-norm, sinusoidal model's whatever they say; importing either way would be a guess
_IGNORED = (
    "transformers' MarianMTModel ignores it and runs another model than the weights were made "
    "for; not imported"
)
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
    """One-line UserErrors naming the first config.json field transduce cannot represent or
    transformers ignores (``REFUSED_TRUE``)."""
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
            raise UserError(f"{where}: {key} is set ({what}); {_IGNORED}")
    if c.get("static_position_embeddings", True) is not True:
        raise UserError(
            f"{where}: static_position_embeddings is false (learned positions); {_IGNORED}"
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
        max_position_embeddings=exported_positions(m),  # transduce's table grows
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
        "max_length": exported_positions(cfg.model),
        "num_beams": d.beam,
        ALPHA_KEY: d.alpha,  # unread by Hugging Face; transduce's import takes it back
        OFFSET_KEY: d.max_len_offset,  # likewise
    }
    if d.sampling:  # a sampling model samples there too, one sample: no beam
        options.update(
            do_sample=True,
            num_beams=1,
            temperature=d.temperature,
            top_k=d.top_k,  # 0: no cut, there as here
            top_p=d.top_p,
        )
        options[SEED_KEY] = d.sampling_seed
    elif d.beam > 1:  # Hugging Face warns of a length penalty without a beam
        options["length_penalty"] = d.alpha
    return transformers_module().GenerationConfig(**options)


def with_generation_ids(
    c: dict[str, Any], generation: dict[str, Any], where: Path
) -> dict[str, Any]:
    """config.json's fields ``c`` with the ids ``generate`` takes from generation_config.json
    (``generation``, read from ``where``) where it sets them: the decoder's start token; its
    EOS must be config.json's (transduce ends at one EOS token)."""
    start = generation.get("decoder_start_token_id")
    if start is not None:
        c = {**c, "decoder_start_token_id": start}
    eos = generation.get("eos_token_id")
    if isinstance(eos, list) and len(eos) == 1:
        eos = eos[0]
    if eos is not None and eos != c.get("eos_token_id"):
        raise UserError(
            f"{where}: eos_token_id {eos!r} and config.json's {c.get('eos_token_id')!r}: "
            "transduce ends at one EOS token; make them agree"
        )
    return c


def generation_in_config(c: dict[str, Any]) -> dict[str, Any]:
    """The generation settings of config.json's fields ``c``: what ``generate`` takes from
    config.json where a folder has no generation_config.json (older OPUS-MT folders)."""
    keys = transformers_module().GenerationConfig().to_dict().keys()
    return {k: v for k, v in c.items() if k in keys}


def _number(where: Path, key: str, value: Any, kind: type, low: float) -> Any:
    ok = isinstance(value, int | float) if kind is float else isinstance(value, int)
    if not ok or isinstance(value, bool) or value < low:
        raise UserError(f"{where}: {key} {value!r}; expected {kind.__name__} >= {low}")
    return kind(value)


def decode_config(generation: dict[str, Any], c: dict[str, Any], where: Path) -> DecodeConfig:
    """The decoding settings of a Marian folder: its generation_config.json (``generation``, at
    ``where``; where there is none, ``generation_in_config`` of config.json, at that path) over
    its config.json ``c`` (with ``with_generation_ids``'s ids): the beam (``num_beams``: 1 where
    the settings leave it out, as ``generate`` takes it), sampling (``do_sample`` with one beam:
    ``temperature``, ``top_k``, ``top_p``, Hugging Face's defaults where unset), an export's
    alpha, output cap and seed. A setting transduce has no counterpart for
    (``GENERATION_NO_OPS``, words banned other than the padding and start tokens, which it never
    generates) is a UserError naming it."""
    for key, no_ops in GENERATION_NO_OPS.items():
        if key in generation and generation[key] not in no_ops:
            raise UserError(
                f"{where}: {key} {generation[key]!r}: transduce's decoding has no such setting "
                "(generate's outputs would differ from the import's); remove it to import"
            )
    never = {c.get("pad_token_id"), c.get("decoder_start_token_id")}
    banned = generation.get("bad_words_ids") or []
    if not isinstance(banned, list) or not all(
        isinstance(w, list) and all(type(i) is int for i in w) for w in banned
    ):
        raise UserError(f"{where}: bad_words_ids {banned!r}; expected lists of token ids")
    for words in banned:
        if not (isinstance(words, list) and len(words) == 1 and words[0] in never):
            raise UserError(
                f"{where}: bad_words_ids bans {words!r}: transduce bans only the padding and "
                "start tokens, which it never generates; remove it to import"
            )
    # generate's default 1 (transformers leaves 1 out of the files it saves)
    beam = _number(where, "num_beams", generation.get("num_beams", 1), int, 1)
    # transduce's GNMT alpha and output cap, which an export writes beside Hugging Face's
    # length_penalty and max_length (not the same: a folder of another tool keeps the defaults)
    alpha = _number(where, ALPHA_KEY, generation.get(ALPHA_KEY, DecodeConfig.alpha), float, 0)
    offset = generation.get(OFFSET_KEY, DecodeConfig.max_len_offset)
    offset = _number(where, OFFSET_KEY, offset, int, 0)
    sampling = generation.get("do_sample") or False
    if not isinstance(sampling, bool):
        raise UserError(f"{where}: do_sample {sampling!r}; expected true or false")
    settings: dict[str, Any] = {}
    if sampling:
        if beam != 1:
            raise UserError(
                f"{where}: do_sample with num_beams {beam} (beam sampling): transduce samples "
                "one token at a time without a beam; set num_beams 1 or do_sample false"
            )
        got = {k: generation.get(k) for k in HF_SAMPLING_DEFAULTS}
        got = {k: HF_SAMPLING_DEFAULTS[k] if v is None else v for k, v in got.items()}
        settings = {
            "sampling": True,
            "temperature": _number(where, "temperature", got["temperature"], float, 0),
            "top_k": _number(where, "top_k", got["top_k"], int, 0),
            "top_p": _number(where, "top_p", got["top_p"], float, 0),
            "sampling_seed": _number(where, SEED_KEY, generation.get(SEED_KEY, 0), int, 0),
        }
    try:
        return DecodeConfig(beam=beam, alpha=alpha, max_len_offset=offset, **settings)
    except UserError as e:  # a value out of transduce's range
        raise UserError(f"{where}: {e}") from None
