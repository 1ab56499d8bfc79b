"""Hugging Face Marian models in and out: ``import_marian`` turns a local ``MarianMTModel`` folder
(an OPUS-MT model: ``config.json``, the weights, ``source.spm``, ``target.spm``, ``vocab.json``)
into an ordinary transduce model file, and ``export_marian`` a transduce Transformer into such
a folder, which ``MarianMTModel.from_pretrained`` and ``AutoTokenizer.from_pretrained`` load
offline (and ``pipeline("translation", model=...)`` in transformers 4; version 5 dropped that
pipeline). Both need ``transformers``: ``pip install 'transduce[hf]'``.

What maps onto what (configurations: ``marian_config``; weights: ``marian_weights``):

* post-norm layers, embeddings times sqrt(d_model) (Marian's ``scale_embedding``), static
  sinusoids (the model dimension permuted between Marian's sines-then-cosines and the paper's
  interleaving; the function is kept exactly), biases on every projection;
* Marian's ``activation_function`` (OPUS-MT: swish) as ``ModelConfig.activation``, its
  ``final_logits_bias`` as the output layer's bias (``ModelConfig.output_bias``);
* the vocabulary: a ``MarianVocab`` (``source.spm`` splits source text, ``target.spm`` splits
  target text, as ``text_target``, and joins the output; ``vocab.json`` gives the ids), ids
  reordered into transduce's (PAD 0, BOS 1, EOS 2, UNK 3, then the others in Marian's order).
  Marian starts decoding from ``decoder_start_token_id`` (OPUS-MT: the pad id) where transduce
  starts from BOS: BOS is then an added row holding that token's decoder
  embedding, which the output layer never predicts (bias ``NEVER``), so the searches need no
  start token of their own. (``MarianTokenizer`` joins the output of a joint vocabulary with
  ``source.spm``, ``MarianVocab`` with ``target.spm``: the same text for the pieces of either
  model, as the tests check.)
* embeddings: ``share_encoder_decoder_embeddings`` with ``tie_word_embeddings`` is the paper's
  three-way sharing; shared without tying gives separate source and target embeddings with the
  same values (the function is Marian's; fine-tuning would let them part); not shared: two
  embeddings, the target's tied to the output layer or not as Marian's, of one vocabulary where
  ``vocab.json`` gives both sides the same ids (an export's, ``task.shared_vocab``) or else a
  ``VocabPair`` (``vocab.json`` for both sides, or ``target_vocab.json`` for the target).

Exported folders keep transduce's ids in ``vocab.json`` and start decoding from ``<s>``; PAD and
BOS are never generated (``bad_words_ids``), as in transduce's searches. Their position table
holds the model's ``max_positions``, at least 1024 (transduce's sinusoids grow with the input,
Marian's table is fixed: ``export.positions``). Their ``generation_config.json`` holds a sampling
model's ``do_sample``, ``temperature``, ``top_k`` and ``top_p`` (one beam; its seed as
``transduce_sampling_seed``), and a searching model's beam as ``num_beams``, its output length
cap as ``transduce_max_len_offset`` and its alpha as ``transduce_alpha`` (which an import reads
back; a folder without them gets transduce's defaults) and as ``length_penalty``, which
Hugging Face applies as ``log P / |Y| ** length_penalty`` where transduce applies the GNMT
``log P / ((5 + |Y|) / 6) ** alpha`` (the same only at 0). Greedy outputs are the same. Beams
can differ even then: transduce's shrinks as hypotheses finish (Marian's way), Hugging Face's
keeps W live ones, and a forced EOS (at the length limit) counts
its log-probability here and 0 there (tests/export/test_huggingface*.py: 39 of 40 lines alike
on a trained model, the other one a choice of the search).

An import takes ``generate``'s settings from ``generation_config.json`` (over ``config.json``):
the start token, the beam, sampling (Hugging Face's defaults where unset, such as ``top_k`` 50).
Its ``max_length`` is not read: transduce caps an output at the source's length plus
``max_len_offset`` (a longer output than that is the only way the two can part on greedy search).

What neither side can represent is refused in one line naming the field: on import
``normalize_before``, ``normalize_embedding`` / ``layernorm_embedding``, ``add_final_layer_norm``,
``static_position_embeddings: false``, ``scale_embedding: false``, unequal encoder and decoder
shapes, an odd ``d_model``, generation settings transduce has none of (``no_repeat_ngram_size``,
``repetition_penalty``, ``min_length``, ``forced_bos_token_id``, words banned other than the
padding and start tokens, beam sampling, ... : ``marian_config.GENERATION_NO_OPS``), an EOS in
``generation_config.json`` other than ``config.json``'s; on export the recurrent baseline,
pre-norm, learned positions, word positions, d_k or d_v other than d_model / n_heads,
vocabularies other than SentencePiece ones.
"""

from __future__ import annotations

import json
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from transduce.checkpoint import check_finite, load_model, save_model_file
from transduce.config import Config, TranslationTaskConfig
from transduce.data.marian_vocab import MarianVocab, sentencepiece_processor
from transduce.data.vocab import (
    BOS,
    EOS,
    PAD,
    SPECIALS,
    UNK,
    Vocab,
    VocabPair,
    vocab_sizes,
)
from transduce.errors import UserError
from transduce.export.folders import check_not_inside, check_replaceable
from transduce.export.marian_config import (
    ALPHA_KEY,
    check_exportable,
    check_marian_config,
    decode_config,
    generation_config,
    generation_in_config,
    marian_config,
    model_config,
    quiet_transformers,
    transformers_module,
    with_generation_ids,
)
from transduce.export.marian_weights import from_marian_state, to_marian_state
from transduce.model.transformer import make_model

__all__ = ["export_marian", "import_marian"]

SPM_FILES = ("source.spm", "target.spm")


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise UserError(f"{path} not found: not a Marian model folder")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UserError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object")
    return data


def _optional_json(path: Path) -> dict[str, Any]:
    return _read_json(path) if path.is_file() else {}


# --- import ---------------------------------------------------------------------------------------


def _vocab_order(
    vocab: dict[str, int], size: int, *, pad: int, eos: int, unk: int, start: int | None, name: str
) -> tuple[list[int | None], list[str]]:
    """(order, pieces): the Marian id of each transduce id (None: the added BOS) and the pieces
    by transduce id, for a vocabulary of ``size`` ids (``start``: the decoder's first input, or
    None on the source side)."""
    by_id: dict[int, str] = {}
    for piece, i in vocab.items():
        if not isinstance(i, int) or not 0 <= i < size or i in by_id:
            raise UserError(
                f"{name}: {piece!r} has id {i!r}; the model's ids are 0..{size - 1}, each once"
            )
        by_id[i] = piece
    if len(by_id) != size:
        raise UserError(f"{name} has {len(by_id)} pieces, the model {size} ids")
    for label, i in (("pad", pad), ("eos", eos), ("unk", unk)):
        if i not in by_id:
            raise UserError(f"{name} has no {label} id {i}")
    if start is not None and start not in by_id:
        raise UserError(f"{name} has no id {start}, the decoder's start (decoder_start_token_id)")
    real_bos = start is not None and start not in (pad, eos, unk) and by_id[start] == "<s>"
    bos = start if real_bos else None
    specials = [pad, bos, eos, unk]
    if len({s for s in specials if s is not None}) != 3 + (bos is not None):
        raise UserError(f"{name}: pad, eos and unk ids must differ; got {pad}, {eos}, {unk}")
    rest = [i for i in range(size) if i not in specials]
    pieces = [*SPECIALS, *(by_id[i] for i in rest)]
    if len(set(pieces)) != len(pieces):
        clash = next(p for p in SPECIALS if p in {by_id[i] for i in rest})
        raise UserError(f"{name} holds {clash!r} as an ordinary piece; transduce reserves it")
    return [*specials, *rest], pieces


def _load_marian_state(folder: Path) -> dict[str, torch.Tensor]:
    """The weights of ``folder``'s ``MarianMTModel``; a UserError where they cannot be read or
    miss a tensor (transformers would fill it with random numbers and go on)."""
    transformers = transformers_module()
    try:
        with quiet_transformers():
            model, info = transformers.MarianMTModel.from_pretrained(
                str(folder), local_files_only=True, output_loading_info=True
            )
    except Exception as e:  # noqa: BLE001 (safetensors' and transformers' own errors too)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        if "ignore_mismatched_sizes" in first:  # transformers' hint, not the cause
            first = "their shapes are not those config.json gives"
        raise UserError(f"{folder}: cannot load the Marian weights ({first})") from None
    for kind in ("missing_keys", "mismatched_keys", "unexpected_keys"):
        # Marian's sinusoids are made, not stored
        keys = [k for k in info.get(kind) or () if "embed_positions" not in str(k)]
        if keys:
            what = kind.replace("_keys", "")
            more = f" and {len(keys) - 1} more" if len(keys) > 1 else ""
            hint = " (config.json says fewer layers?)" if what == "unexpected" else ""
            raise UserError(f"{folder}: the weights file has {what} tensors: {keys[0]}{more}{hint}")
    state = {k: v.detach().float() for k, v in model.state_dict().items()}
    check_finite(folder, state)  # a model of NaN would be refused by every later command
    return state


def _token(tok: dict[str, Any], key: str, default: str, folder: Path) -> str:
    """tokenizer_config.json's ``key`` token: a string, or the {"content": ...} object older
    transformers wrote; anything else a UserError naming the file and key."""
    piece = tok.get(key, default)
    piece = piece.get("content") if isinstance(piece, dict) else piece
    if not isinstance(piece, str):
        raise UserError(
            f"{folder / 'tokenizer_config.json'}: {key} must be a token (a string); "
            f"got {tok.get(key)!r}"
        )
    return piece


def _special_ids(tok: dict[str, Any], vocab: dict[str, int], folder: Path) -> dict[str, int]:
    """The pad, eos and unk ids of the source vocabulary (the tokenizer's tokens)."""
    names = {
        "pad": _token(tok, "pad_token", "<pad>", folder),
        "eos": _token(tok, "eos_token", "</s>", folder),
        "unk": _token(tok, "unk_token", "<unk>", folder),
    }
    ids = {}
    for label, piece in names.items():
        if piece not in vocab:
            raise UserError(f"{folder / 'vocab.json'} has no {label} token {piece!r}")
        ids[label] = vocab[piece]
    return ids


@dataclass(frozen=True)
class _Vocabularies:
    """A Marian folder's vocabulary as transduce's, and where each transduce id comes from."""

    vocab: Vocab  # a MarianVocab (one vocabulary, as a shared_vocab model's) or a VocabPair
    src_order: list[int | None]  # the Marian id of each transduce source id
    tgt_order: list[int | None]  # ... target id (None: the added BOS)
    start: int  # the Marian id the decoder starts from
    share: bool  # share_encoder_decoder_embeddings

    @property
    def shared_vocab(self) -> bool:
        return not isinstance(self.vocab, VocabPair)


def _read_vocabularies(folder: Path, c: dict[str, Any]) -> _Vocabularies:
    """The tokenizer files of ``folder`` against its config.json ``c``."""
    tok = _optional_json(folder / "tokenizer_config.json")
    for f in (*SPM_FILES, "vocab.json"):
        if not (folder / f).is_file():
            raise UserError(
                f"{folder / f} not found: a Marian folder has {', '.join(SPM_FILES)}, vocab.json"
            )
    src_json = _read_json(folder / "vocab.json")
    separate = tok.get("separate_vocabs", False)
    if not isinstance(separate, bool):  # "false" would read as true
        raise UserError(
            f"{folder / 'tokenizer_config.json'}: separate_vocabs {separate!r}; expected true "
            "or false"
        )
    tgt_json = _read_json(folder / "target_vocab.json") if separate else src_json
    share = bool(c.get("share_encoder_decoder_embeddings", True))
    src_size = c["vocab_size"]
    tgt_size = src_size if share else c.get("decoder_vocab_size") or src_size
    ids = _special_ids(tok, src_json, folder)
    pad, eos = c.get("pad_token_id"), c.get("eos_token_id")
    start = c.get("decoder_start_token_id", pad)
    if not (isinstance(pad, int) and isinstance(eos, int) and isinstance(start, int)):
        raise UserError(
            f"{folder}/config.json: pad_token_id, eos_token_id and "
            "decoder_start_token_id must be ids"
        )
    tgt_unk = (
        tgt_json.get(_token(tok, "unk_token", "<unk>", folder), ids["unk"])
        if separate
        else ids["unk"]
    )
    tgt_order, tgt_pieces = _vocab_order(
        tgt_json,
        tgt_size,
        pad=pad,
        eos=eos,
        unk=tgt_unk,
        start=start,
        name=str(folder / ("target_vocab.json" if separate else "vocab.json")),
    )
    source_spm, target_spm = ((folder / f).read_bytes() for f in SPM_FILES)
    for f, proto in zip(SPM_FILES, (source_spm, target_spm), strict=True):
        sentencepiece_processor(proto, str(folder / f))  # each named by its file
    if share:  # one vocabulary, one layout: the target's (the source never holds BOS)
        if separate or (ids["pad"], ids["eos"]) != (pad, eos):
            raise UserError(
                f"{folder}: share_encoder_decoder_embeddings with the tokenizer's "
                f"pad/eos ids {ids['pad']}/{ids['eos']} and config.json's "
                f"{pad}/{eos}; shared embeddings need one vocabulary"
            )
        vocab = MarianVocab(tgt_pieces, source_spm, target_spm)
        return _Vocabularies(vocab, tgt_order, tgt_order, start, share)
    # an export's source side holds transduce's <s> (BOS); an OPUS-MT one has none
    src_bos = src_json.get("<s>")
    src_order, src_pieces = _vocab_order(
        src_json,
        src_size,
        **ids,
        start=src_bos if isinstance(src_bos, int) else None,
        name=str(folder / "vocab.json"),
    )
    if not separate and src_order == tgt_order:  # one vocabulary, two embeddings (an export's)
        vocab = MarianVocab(tgt_pieces, source_spm, target_spm)
        return _Vocabularies(vocab, src_order, tgt_order, start, share)
    pair = VocabPair(
        MarianVocab(src_pieces, source_spm, source_spm),
        MarianVocab(tgt_pieces, target_spm, target_spm),
    )
    return _Vocabularies(pair, src_order, tgt_order, start, share)


def import_marian(folder: str | Path, output: str | Path, *, force: bool = False) -> dict[str, Any]:
    """Write the Marian model of ``folder`` (what ``MarianMTModel.save_pretrained`` and
    ``MarianTokenizer.save_pretrained`` write) as the transduce model file ``output`` (a name
    ending ``.safetensors``: in that format), which must not exist unless ``force``; returns a
    summary. What transduce cannot represent, or transformers ignores, is a one-line UserError
    naming the config field."""
    folder, output = Path(folder), Path(output)
    if output.is_dir():
        raise UserError(f"{output}: is a folder; --output names the model file to write")
    if output.exists() and not force:
        raise UserError(f"{output} exists; --force replaces it")
    c = _read_json(folder / "config.json")
    check_marian_config(c, folder / "config.json")
    generation_file = folder / "generation_config.json"
    if generation_file.is_file():
        generation = _read_json(generation_file)
    else:  # generate takes config.json's settings then
        generation, generation_file = generation_in_config(c), folder / "config.json"
    c = with_generation_ids(c, generation, generation_file)  # generate's ids, where it sets them
    decode = decode_config(generation, c, generation_file)
    v = _read_vocabularies(folder, c)
    model_cfg = model_config(c, folder / "config.json")
    state = from_marian_state(
        _load_marian_state(folder),
        n_layers=model_cfg.n_layers,
        src_order=v.src_order,
        tgt_order=v.tgt_order,
        start=v.start,
        tied=model_cfg.tie_embeddings,
    )
    src_size, tgt_size = vocab_sizes(v.vocab)
    model = make_model(model_cfg, src_vocab_size=src_size, tgt_vocab_size=tgt_size)
    model.load_state_dict(state)
    task = TranslationTaskConfig(shared_vocab=v.shared_vocab)
    cfg = Config(model=model_cfg, task=task, decode=decode)
    written: dict[str, Any] = {
        "config": cfg.to_dict(),
        "vocab": v.vocab.to_dict(),
        "model": model.state_dict(),
    }
    save_model_file(written, output)
    return {
        "input": str(folder),
        "output": str(output),
        "format": "marian",
        "n_layers": model_cfg.n_layers,
        "d_model": model_cfg.d_model,
        "activation": model_cfg.activation,
        "shared_vocab": v.shared_vocab,
        "tie_embeddings": model_cfg.tie_embeddings,
        "vocab_size": len(v.vocab),
        "added_bos": v.tgt_order[BOS] is None,
        "beam": cfg.decode.beam,
        "alpha": cfg.decode.alpha,
    }


# --- export ---------------------------------------------------------------------------------------


def _side(vocab: object, where: str) -> tuple[list[str], bytes, bytes]:
    """(pieces by id, SentencePiece model that splits, model that joins) of one vocabulary."""
    from transduce.data.subword import SentencePieceVocab

    if isinstance(vocab, MarianVocab):
        return list(vocab.pieces), vocab.encoder_model, vocab.decoder_model
    if isinstance(vocab, SentencePieceVocab):
        pieces = [*SPECIALS, *(vocab.id_to_piece(i) for i in range(len(SPECIALS), len(vocab)))]
        return pieces, vocab.model_proto, vocab.model_proto
    raise UserError(
        f"{where}: Marian needs a SentencePiece vocabulary; this one is a {type(vocab).__name__}"
    )


def _vocab_files(vocab: Vocab, where: str) -> dict[str, Any]:
    """What the tokenizer files hold: source/target pieces and SentencePiece models."""
    if isinstance(vocab, VocabPair):
        src, tgt = _side(vocab.source, where), _side(vocab.target, where)
        return {"src": src[0], "tgt": tgt[0], "source_spm": src[1], "target_spm": tgt[2]}
    pieces, enc, dec = _side(vocab, where)
    return {"src": pieces, "tgt": pieces, "source_spm": enc, "target_spm": dec}


# what an export writes (and transformers' tokenizer beside it, in some versions): all that
# --force replaces
_WRITTEN = frozenset(
    {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "pytorch_model.bin",
        *SPM_FILES,
        "vocab.json",
        "target_vocab.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
    }
)


def _not_an_export(folder: Path) -> str | None:
    """Why the folder ``folder`` is not an earlier Marian export of transduce (None when it is):
    its generation_config.json holds the key only an export writes."""
    if not (folder / "config.json").is_file() or not (folder / "vocab.json").is_file():
        return "is a folder that holds no Marian model"  # "." or a run folder
    try:
        generation = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        generation = None
    if not isinstance(generation, dict) or ALPHA_KEY not in generation:
        return "holds a Marian model that transduce did not export"  # a downloaded OPUS-MT one
    return None


def _prepare_folder(folder: Path, force: bool) -> None:
    check_replaceable(folder, force, _WRITTEN, _not_an_export)
    if folder.is_dir():
        shutil.rmtree(folder)


def _marian_tokenizer(folder: Path, separate: bool) -> Any:
    """transformers' MarianTokenizer of the files ``_write_tokenizer`` wrote in ``folder``."""
    return transformers_module().MarianTokenizer(
        str(folder / SPM_FILES[0]),
        str(folder / SPM_FILES[1]),
        str(folder / "vocab.json"),
        target_vocab_file=str(folder / "target_vocab.json") if separate else None,
        separate_vocabs=separate,
        unk_token=SPECIALS[UNK],
        eos_token=SPECIALS[EOS],
        pad_token=SPECIALS[PAD],
    )


def _write_tokenizer(folder: Path, files: dict[str, Any], separate: bool) -> None:
    (folder / SPM_FILES[0]).write_bytes(files["source_spm"])
    (folder / SPM_FILES[1]).write_bytes(files["target_spm"])
    vocab_files = {"vocab.json": files["src"]}
    if separate:
        vocab_files["target_vocab.json"] = files["tgt"]
    for name, pieces in vocab_files.items():
        text = json.dumps({p: i for i, p in enumerate(pieces)}, ensure_ascii=False, indent=1)
        (folder / name).write_text(text + "\n", encoding="utf-8")
    with warnings.catch_warnings():  # "Recommended: pip install sacremoses": not used here
        warnings.filterwarnings("ignore", message=".*sacremoses")
        _marian_tokenizer(folder, separate).save_pretrained(str(folder))


def export_marian(
    model_path: str | Path, folder: str | Path, *, force: bool = False
) -> dict[str, Any]:
    """Write the transduce model file ``model_path`` as a Marian folder ``folder``; returns a
    summary. A model Marian cannot represent is a one-line UserError; an existing ``folder``
    is one unless ``force`` (and even then unless it is empty or a previous export)."""
    transformers = transformers_module()
    model_path, folder = Path(model_path), Path(folder)
    check_not_inside(model_path, folder)
    loaded, vocab, cfg = load_model(model_path, device="cpu")
    model = check_exportable(loaded, cfg, model_path)
    files = _vocab_files(vocab, str(model_path))
    separate = files["src"] != files["tgt"]
    src_embed, tgt_embed = model.encoder.embed.weight, model.decoder.embed.weight
    share = not separate and (src_embed is tgt_embed or torch.equal(src_embed, tgt_embed))
    hf_config = marian_config(cfg, len(files["src"]), len(files["tgt"]), share)
    state = to_marian_state(model.state_dict(), n_layers=cfg.model.n_layers)
    if not share:
        del state["model.shared.weight"]
    hf_model = transformers.MarianMTModel(hf_config)
    missing, unexpected = hf_model.load_state_dict(state, strict=False)
    left = [k for k in missing if "embed_positions" not in k]
    if left or unexpected:
        raise AssertionError(f"Marian weights left out {left}, unknown {unexpected}")
    hf_model.generation_config = generation_config(cfg)
    _prepare_folder(folder, force)
    with quiet_transformers():  # a bar for one shard: noise on the command's stderr
        hf_model.save_pretrained(str(folder))
    _write_tokenizer(folder, files, separate)
    return {
        "input": str(model_path),
        "output": str(folder),
        "format": "marian",
        "vocab_size": len(files["tgt"]),
        "separate_vocabs": separate,
        "share_encoder_decoder_embeddings": share,
        "tie_word_embeddings": cfg.model.tie_embeddings,
        "num_beams": 1 if cfg.decode.sampling else cfg.decode.beam,  # as generation_config.json
        "do_sample": cfg.decode.sampling,
        "files": sorted(p.name for p in folder.iterdir()),
    }
