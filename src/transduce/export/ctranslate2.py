"""Export to CTranslate2 (https://github.com/OpenNMT/CTranslate2), a C++ inference engine for
Transformers, through its Python converter API: ``pip install 'transduce[export]'``.

The folder written holds ``model.bin`` and ``config.json`` (CTranslate2's), the vocabulary
(``shared_vocabulary.json``: our pieces in our id order, so PAD 0 ``<pad>``, BOS 1 ``<s>``, EOS 2
``</s>``, UNK 3 ``<unk>``), ``sentencepiece.model`` (the checkpoint's vocabulary, to split text
into those pieces and join them back) and ``transduce.json`` (where it came from and the model's
decoding defaults). Translate with::

    import ctranslate2, sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=f"{out}/sentencepiece.model")
    tr = ctranslate2.Translator(out)
    res = tr.translate_batch([sp.encode(s, out_type=str) for s in sentences], beam_size=1)
    [sp.decode(r.hypotheses[0]) for r in res]

or with ``translate_with_ctranslate2`` below, which does just that.

How our model maps onto CTranslate2's ``TransformerSpec``:

* post-norm (the paper's ``LayerNorm(x + Sublayer(x))``): ``pre_norm=False``, which has no final
  layer norm; pre-norm models get ``pre_norm=True`` with our final norms. LayerNorm epsilon is
  written into the config (ours 1e-5; CTranslate2 would otherwise assume its own default).
* embeddings times sqrt(d_model): ``scale_embeddings``; the FFN's activation (ReLU, or swish or
  GELU); biases on every projection, and on the pre-softmax one with ``output_bias``.
* sinusoidal positions: CTranslate2's built-in table puts the sines in the first half and the
  cosines in the second (as fairseq and Marian do), while the paper (and ``positional_table``)
  interleaves them, so our table is written explicitly into ``position_encodings``
  (the model's ``max_positions`` rows, at least 1024: ours grows with the input, CTranslate2's
  is fixed; ``translate_with_ctranslate2`` refuses a longer source, where CTranslate2 would cut
  it short, and caps outputs there). Learned positions are written as they are.
* the source gets EOS appended (``add_source_eos``), the target starts from ``<s>``, as in
  training; the shared embedding / pre-softmax matrix is stored once (CTranslate2 aliases equal
  weights).
* d_k must equal d_v; d_k other than d_model / n_heads is passed as CTranslate2's ``head_dim``.

Decoding differences. CTranslate2's beam search normalises scores by ``length **
length_penalty`` rather than the GNMT penalty ``((5 + length) / 6) ** alpha``, so beam outputs can
differ from ``Translator``'s. Its outputs are capped at one ``max_decoding_length`` per call
(default 256) where ours are capped per sentence at source length + ``max_len_offset``, and it may
generate ``<pad>`` and ``<s>``, which ours never do. ``translate_with_ctranslate2`` closes both
gaps (one call per source length, ``suppress_sequences``), and with ``beam_size=1`` gives our
greedy translations (tested).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from transduce.data.marian_vocab import language_code
from transduce.data.vocab import BOS, EOS, PAD, SPECIALS, UNK, VocabPair
from transduce.errors import UserError
from transduce.export.folders import check_not_inside, check_replaceable
from transduce.export.positions import exported_positions
from transduce.inference.text_inputs import text_list
from transduce.model.transformer import Transformer

__all__ = [
    "QUANTIZATIONS",
    "build_spec",
    "export_checkpoint",
    "export_model",
    "translate_with_ctranslate2",
]

QUANTIZATIONS = (
    "int8",
    "int8_float32",
    "int8_float16",
    "int8_bfloat16",
    "int16",
    "float16",
    "bfloat16",
    "float32",
)
SENTENCEPIECE_FILE = "sentencepiece.model"
# a model imported from Marian joins target pieces with its own SentencePiece model
TARGET_SENTENCEPIECE_FILE = "target_sentencepiece.model"
INFO_FILE = "transduce.json"
CHARACTERS = "characters"  # transduce.json's tokenizer of a model of one token per character
LANGUAGE_CODES = "language_codes"  # transduce.json: a leading >>xx<< is one token (Marian's way)


def _ct2() -> Any:
    try:
        import ctranslate2
    except ImportError:
        raise UserError(
            "exporting to CTranslate2 needs the ctranslate2 package: pip install "
            "'transduce[export]'"
        ) from None
    return ctranslate2


def _array(t: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.detach().to("cpu", torch.float32).numpy())


def _set_linear(spec: Any, linears: Sequence[nn.Linear]) -> None:
    """One CTranslate2 linear from one or more of ours (stacked along the output dimension, as
    CTranslate2 fuses Q/K/V and K/V)."""
    spec.weight = _array(torch.cat([lin.weight for lin in linears]))
    if linears[0].bias is not None:
        spec.bias = _array(torch.cat([lin.bias for lin in linears]))


def _set_norm(spec: Any, norm: nn.LayerNorm) -> None:
    spec.gamma = _array(norm.weight)
    spec.beta = _array(norm.bias)


def _set_attention(spec: Any, mha: Any, norm: nn.LayerNorm, *, self_attention: bool) -> None:
    for name in ("w_q", "w_k", "w_v", "w_o"):
        if not isinstance(getattr(mha, name, None), nn.Linear):
            raise UserError(
                f"cannot export this attention layer: it has no {name} projection (the exporter "
                "knows the w_q/w_k/w_v/w_o layout of transduce.model.MultiHeadAttention)"
            )
    if self_attention:
        _set_linear(spec.linear[0], [mha.w_q, mha.w_k, mha.w_v])
    else:
        _set_linear(spec.linear[0], [mha.w_q])
        _set_linear(spec.linear[1], [mha.w_k, mha.w_v])
    _set_linear(spec.linear[-1], [mha.w_o])
    _set_norm(spec.layer_norm, norm)


def _set_ffn(spec: Any, ffn: Any, norm: nn.LayerNorm) -> None:
    _set_linear(spec.linear_0, [ffn.w_1])
    _set_linear(spec.linear_1, [ffn.w_2])
    _set_norm(spec.layer_norm, norm)


def _positions(module: nn.Module, d_model: int, max_positions: int) -> np.ndarray:
    from transduce.model.positions import (
        LearnedPositions,
        SinusoidalPositions,
        positional_table,
    )

    if isinstance(module, SinusoidalPositions):
        return _array(positional_table(max_positions, d_model))
    if isinstance(module, LearnedPositions):
        return _array(module.weight)
    raise UserError(f"cannot export positions of type {type(module).__name__}")


def _check_tokens(tokens: Sequence[str], vocab_size: int) -> list[str]:
    tokens = [str(t) for t in tokens]
    if len(tokens) != vocab_size:
        raise UserError(f"the vocabulary has {len(tokens)} tokens but the model {vocab_size}")
    for i in (PAD, BOS, EOS, UNK):
        if tokens[i] != SPECIALS[i]:
            raise UserError(
                f"token {i} is {tokens[i]!r}, the exporter needs {SPECIALS[i]!r} "
                f"(transduce's special tokens are {', '.join(SPECIALS)})"
            )
    seen: set[str] = set()
    for t in tokens:
        if t in seen:
            raise UserError(f"the vocabulary holds {t!r} twice; CTranslate2 needs distinct tokens")
        seen.add(t)
    return tokens


def build_spec(
    model: Transformer, tokens: Sequence[str], *, max_positions: int | None = None
) -> Any:
    """A filled ``ctranslate2.specs.TransformerSpec`` of ``model`` (a ``transduce.model.
    Transformer``) with ``tokens`` (the pieces by id) as its source and target vocabulary."""
    ct2 = _ct2()
    from ctranslate2.specs import common_spec, transformer_spec

    cfg = model.config
    if cfg.d_k != cfg.d_v:
        raise UserError(
            f"CTranslate2 needs d_k = d_v; this model has d_k {cfg.d_k} and d_v {cfg.d_v}"
        )
    if cfg.position_unit != "token":
        raise UserError("CTranslate2 counts positions in tokens; this model counts them in words")
    head_dim = None if cfg.d_k * cfg.n_heads == cfg.d_model else cfg.d_k
    pre_norm = cfg.norm == "pre"
    activation = {
        "relu": common_spec.Activation.RELU,
        "swish": common_spec.Activation.SWISH,
        "gelu": common_spec.Activation.GELU,
    }[cfg.activation]
    common = {"pre_norm": pre_norm, "activation": activation}
    if head_dim is not None:
        common["head_dim"] = head_dim
    encoder = transformer_spec.TransformerEncoderSpec(cfg.n_layers, cfg.n_heads, **common)
    decoder = transformer_spec.TransformerDecoderSpec(cfg.n_layers, cfg.n_heads, **common)
    spec = transformer_spec.TransformerSpec(encoder, decoder)

    # the modules as Any: a ModuleList's items are typed Module, final_norm LayerNorm | Identity
    sides: tuple[tuple[Any, Any], ...] = (
        (spec.encoder, model.encoder),
        (spec.decoder, model.decoder),
    )
    for side_spec, side in sides:
        embeddings = side_spec.embeddings
        if isinstance(embeddings, list):  # the encoder may have several source embeddings
            embeddings = embeddings[0]
        embeddings.weight = _array(side.embed.weight)
        side_spec.scale_embeddings = True  # sqrt(d_model), as Embeddings does
        side_spec.position_encodings.encodings = _positions(
            side.positions, cfg.d_model, exported_positions(cfg, max_positions)
        )
        if pre_norm:
            _set_norm(side_spec.layer_norm, side.final_norm)
    encoder_layers: list[Any] = list(model.encoder.layers)
    decoder_layers: list[Any] = list(model.decoder.layers)
    for ls, layer in zip(spec.encoder.layer, encoder_layers, strict=True):
        _set_attention(ls.self_attention, layer.self_attn, layer.norms[0], self_attention=True)
        _set_ffn(ls.ffn, layer.ffn, layer.norms[1])
    for ls, layer in zip(spec.decoder.layer, decoder_layers, strict=True):
        _set_attention(ls.self_attention, layer.self_attn, layer.norms[0], self_attention=True)
        _set_attention(ls.attention, layer.cross_attn, layer.norms[1], self_attention=False)
        _set_ffn(ls.ffn, layer.ffn, layer.norms[2])
    spec.decoder.projection.weight = _array(model.generator.weight)
    if model.generator.bias is not None:  # output_bias
        spec.decoder.projection.bias = _array(model.generator.bias)

    vocab = _check_tokens(tokens, model.generator.weight.size(0))
    if model.encoder.embed.weight.size(0) != len(vocab):
        raise UserError("CTranslate2 export needs one shared source/target vocabulary")
    spec.register_source_vocabulary(vocab)
    spec.register_target_vocabulary(vocab)
    config = spec.config
    config.unk_token = SPECIALS[UNK]
    config.bos_token = SPECIALS[BOS]
    config.eos_token = SPECIALS[EOS]
    config.decoder_start_token = SPECIALS[BOS]
    config.add_source_bos = False
    config.add_source_eos = True  # the source ends with EOS, as collate makes it
    norms = [m for m in model.modules() if isinstance(m, nn.LayerNorm)]
    config.layer_norm_epsilon = float(norms[0].eps) if norms else 1e-5
    del ct2
    return spec


# what an export writes (CTranslate2's converter, of this version or another, and transduce):
# all that --force replaces
_WRITTEN = frozenset(
    {
        "config.json",
        "model.bin",
        *(
            f"{v}vocabulary.{ext}"
            for v in ("", "shared_", "source_", "target_")
            for ext in ("json", "txt")
        ),
        SENTENCEPIECE_FILE,
        TARGET_SENTENCEPIECE_FILE,
        INFO_FILE,
        INFO_FILE + ".tmp",
    }
)


def _not_an_export(folder: Path) -> str | None:
    """Why ``folder`` is not an earlier CTranslate2 export of transduce (None when it is)."""
    if not (folder / "model.bin").is_file():
        return "is a folder that holds no CTranslate2 model (model.bin)"  # "." or a run folder
    if not (folder / INFO_FILE).is_file():
        return f"holds a CTranslate2 model that transduce did not export (no {INFO_FILE})"
    return None


def export_model(
    model: Transformer,
    tokens: Sequence[str],
    output_dir: str | Path,
    *,
    sentencepiece_model: bytes | None = None,
    target_sentencepiece_model: bytes | None = None,
    quantization: str | None = None,
    force: bool = False,
    max_positions: int | None = None,
    extra_info: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``model`` with vocabulary ``tokens`` as a CTranslate2 model folder; returns a dict
    describing it (also written to ``transduce.json``). ``quantization``: None (float32, as
    trained) or one of ``QUANTIZATIONS``. ``max_positions``: the sinusoidal table's rows (None:
    ``export.positions.exported_positions``). An existing ``output_dir`` is an error unless
    ``force``, and even then unless it is empty or an earlier export of transduce holding nothing
    else (``export.folders.check_replaceable``)."""
    ct2 = _ct2()
    from ctranslate2.converters.converter import Converter

    if quantization is not None and quantization not in QUANTIZATIONS:
        raise UserError(
            f"unknown quantization {quantization!r}; use none or one of {', '.join(QUANTIZATIONS)}"
        )
    out = Path(output_dir)
    check_replaceable(out, force, _WRITTEN, _not_an_export)
    spec = build_spec(model, tokens, max_positions=max_positions)

    class _Loaded(Converter):
        def _load(self) -> Any:
            return spec

    try:
        _Loaded().convert(str(out), quantization=quantization, force=True)
    except (ValueError, RuntimeError, OSError) as e:
        raise UserError(f"CTranslate2 conversion failed: {e}") from None
    if sentencepiece_model is not None:
        (out / SENTENCEPIECE_FILE).write_bytes(sentencepiece_model)
    if target_sentencepiece_model is not None:
        (out / TARGET_SENTENCEPIECE_FILE).write_bytes(target_sentencepiece_model)
    cfg = model.config
    info: dict[str, Any] = {
        "output": str(out),
        "format": "ctranslate2",
        "ctranslate2_version": ct2.__version__,
        "quantization": quantization or "none",
        "vocab_size": len(tokens),
        # without a SentencePiece model the tokens are characters (the synthetic tasks)
        "tokenizer": SENTENCEPIECE_FILE if sentencepiece_model is not None else CHARACTERS,
        "n_layers": cfg.n_layers,
        "d_model": cfg.d_model,
        "n_heads": cfg.n_heads,
        "max_positions": exported_positions(cfg, max_positions),
        **(extra_info or {}),
    }
    tmp = out / (INFO_FILE + ".tmp")
    tmp.write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, out / INFO_FILE)
    info["files"] = sorted(p.name for p in out.iterdir())
    return info


def export_checkpoint(
    path: str | Path,
    output_dir: str | Path,
    *,
    quantization: str | None = None,
    force: bool = False,
    max_positions: int | None = None,
) -> dict[str, Any]:
    """Export a checkpoint (file or run folder) with its SentencePiece vocabulary beside it
    (``max_positions``: as ``export_model``'s)."""
    _ct2()  # before loading a large checkpoint
    from transduce.checkpoint import load_model
    from transduce.data.marian_vocab import MarianVocab
    from transduce.data.subword import SentencePieceVocab

    check_not_inside(Path(path), Path(output_dir))
    model, vocab, cfg = load_model(path, device="cpu")
    if not isinstance(model, Transformer):
        raise UserError(
            f"{path}: CTranslate2 takes a Transformer; this is the {cfg.model.architecture!r} "
            "baseline (model.architecture)"
        )
    if getattr(cfg.task, "reverse_input", False):  # CTranslate2 reads every source forward
        raise UserError(
            f"{path}: this model reads its sources reversed (task.reverse_input); CTranslate2 "
            "has no such setting, so its translations would be of the wrong input"
        )
    target_model: bytes | None = None
    if isinstance(vocab, SentencePieceVocab):
        tokens = [vocab.id_to_piece(i) for i in range(len(vocab))]
        sp_model: bytes | None = vocab.model_proto
    elif isinstance(vocab, MarianVocab):  # imported from Marian: source.spm splits
        tokens, sp_model = list(vocab.pieces), vocab.encoder_model
        if vocab.decoder_model != vocab.encoder_model:  # and target.spm joins
            target_model = vocab.decoder_model
    elif hasattr(vocab, "symbols"):  # CharVocab: one token per character
        tokens = [*SPECIALS, *vocab.symbols]
        sp_model = None
    else:
        two = (
            " (source and target apart: a parser, or shared_vocab: false)"
            if isinstance(vocab, VocabPair)
            else ""
        )
        raise UserError(
            f"the CTranslate2 export takes one vocabulary shared by source and "
            f"target; this model's is a {type(vocab).__name__}{two}"
        )
    d = cfg.decode
    decode: dict[str, Any] = {"beam": d.beam, "alpha": d.alpha, "max_len_offset": d.max_len_offset}
    if d.sampling:  # translate_with_ctranslate2 samples with them by default
        decode.update(
            sampling=True,
            temperature=d.temperature,
            top_k=d.top_k,
            top_p=d.top_p,
            sampling_seed=d.sampling_seed,
        )
    return export_model(
        model,
        tokens,
        output_dir,
        sentencepiece_model=sp_model,
        target_sentencepiece_model=target_model,
        quantization=quantization,
        force=force,
        max_positions=max_positions,
        # a Marian vocabulary takes a leading >>xx<< language code as one token
        extra_info={
            "source_checkpoint": str(path),
            "decode": decode,
            LANGUAGE_CODES: isinstance(vocab, MarianVocab),
        },
    )


def _pieces(text: str, sp: Any, info: dict[str, Any]) -> list[str]:
    """``text`` as the export's tokens: characters (no SentencePiece model), or SentencePiece
    pieces after a leading ``>>xx<<`` language code kept whole where the vocabulary is Marian's
    (as ``MarianVocab.encode`` and Hugging Face's ``MarianTokenizer`` split it)."""
    if sp is None:
        return list(text)
    code, rest = language_code(text) if info.get(LANGUAGE_CODES) else (None, text)
    return ([] if code is None else [code]) + sp.encode(rest, out_type=str)


def _folder_decoding(
    info: dict[str, Any], beam_size: int | None, options: dict[str, Any], ct2: Any
) -> int:
    """The beam size to use, given ``beam_size`` (None: the folder's) and the folder's
    ``transduce.json`` ``info``; a sampling model's settings put into ``options`` (CTranslate2's
    names; top_k 0 is all tokens in both) and its seed set, unless the call names a beam or
    sampling of its own."""
    decode = info.get("decode", {})
    own = beam_size is not None or any(k.startswith("sampling_") for k in options)
    if decode.get("sampling") and not own:
        options["sampling_topk"] = decode["top_k"]
        options["sampling_topp"] = decode["top_p"]
        options["sampling_temperature"] = decode["temperature"]
        ct2.set_random_seed(decode["sampling_seed"])
        return 1
    return int(decode.get("beam", 1)) if beam_size is None else beam_size


def translate_with_ctranslate2(
    model_dir: str | Path,
    sentences: Sequence[str],
    *,
    beam_size: int | None = None,
    max_len_offset: int | None = None,
    device: str = "cpu",
    intra_threads: int = 0,
    **options: Any,
) -> list[str]:
    """Translate raw sentences with an exported folder: SentencePiece pieces in (characters for
    a synthetic task's model, whose folder has no SentencePiece model), CTranslate2's
    ``translate_batch`` (``<pad>`` and ``<s>`` never generated, and ``</s>`` allowed first, as
    in ours: ``min_decoding_length`` 0), pieces joined back. Empty sentences give ``""``.
    ``options`` go to ``translate_batch``. ``beam_size`` None takes the checkpoint's decoding
    from ``transduce.json``: its beam, or for a sampling model its temperature, top-k, top-p
    and seed (one sample); 1 where the folder has none.

    Outputs are capped as ``Translator`` caps them, at (source pieces + EOS + ``max_len_offset``)
    pieces, by one ``translate_batch`` call per source length; ``max_len_offset`` None takes the
    checkpoint's (from ``transduce.json``), or leaves CTranslate2's ``max_decoding_length`` when
    the folder has none.
    """
    ct2 = _ct2()
    import sentencepiece as spm

    model_dir = Path(model_dir)
    info_path = model_dir / INFO_FILE
    info = json.loads(info_path.read_text(encoding="utf-8")) if info_path.is_file() else {}
    sp_file = model_dir / SENTENCEPIECE_FILE
    characters = not sp_file.is_file() and info.get("tokenizer", CHARACTERS) in (CHARACTERS, None)
    if not sp_file.is_file() and not (characters and info):
        raise UserError(f"{model_dir}: no {SENTENCEPIECE_FILE} and no {INFO_FILE}: not an export")
    sp = None if characters else spm.SentencePieceProcessor(model_file=str(sp_file))
    target_file = model_dir / TARGET_SENTENCEPIECE_FILE
    target = (
        spm.SentencePieceProcessor(model_file=str(target_file)) if target_file.is_file() else None
    )
    # CTranslate2 sets OpenMP's thread count for the calling thread, which torch's products use
    # too: torch's count is put back (tests/export/test_ctranslate2.py)
    threads = torch.get_num_threads()
    try:
        translator = ct2.Translator(str(model_dir), device=device, intra_threads=intra_threads)
        beam_size = _folder_decoding(info, beam_size, options, ct2)
        if max_len_offset is None and "max_decoding_length" not in options:
            max_len_offset = info.get("decode", {}).get("max_len_offset")
        texts = [s.strip() for s in text_list(sentences, "sentence")]
        out = [""] * len(texts)
        pieces = {i: _pieces(t, sp, info) for i, t in enumerate(texts) if t}
        positions = info.get("max_positions")
        too_long = [i for i, p in pieces.items() if positions and len(p) + 1 > positions]
        if too_long:  # CTranslate2 would cut the source short in silence (max_input_length)
            i = too_long[0]
            raise UserError(
                f"sentence {i + 1} has {len(pieces[i])} pieces and EOS; this export's position "
                f"table holds {positions}: export again with a larger max_positions"
            )
        options.setdefault("max_input_length", 0)  # no cut: the check above bounds the sources
        groups: dict[int | None, list[int]] = {}
        for i, p in pieces.items():  # one call per output cap
            groups.setdefault(None if max_len_offset is None else len(p), []).append(i)
        options.setdefault("suppress_sequences", [[SPECIALS[PAD]], [SPECIALS[BOS]]])
        options.setdefault("min_decoding_length", 0)  # CTranslate2's 1 forbids </s> first
        for length, todo in groups.items():
            if length is not None and max_len_offset is not None:  # grouped by length: an offset
                cap = length + 1 + max_len_offset  # +1: the source EOS
                # (and no more than the position table holds: CTranslate2's limit)
                options["max_decoding_length"] = min(cap, positions) if positions else cap
            results = translator.translate_batch(
                [pieces[i] for i in todo], beam_size=beam_size, **options
            )
            for i, r in zip(todo, results, strict=True):
                kept = [p for p in r.hypotheses[0] if p not in SPECIALS]
                # a target model: as MarianVocab.decode joins them
                if sp is None:
                    out[i] = "".join(kept)
                elif target is None:
                    out[i] = sp.decode(kept)
                else:
                    out[i] = target.decode_pieces(kept).replace("▁", " ").strip()
        return out
    finally:
        torch.set_num_threads(threads)
