"""Hugging Face Marian models in and out (transduce.export.huggingface), against the real
``transformers`` on Marian folders built here (tests/export/marian_testkit.py; nothing from a hub).

Beam search: transduce's beam shrinks as hypotheses finish (Marian's and Nematus' way) and ranks
finished ones by the GNMT penalty, Hugging Face's keeps W live hypotheses and divides by
``|Y| ** length_penalty``; and where EOS is forced, transduce counts its log-probability and
Hugging Face does not. The searches keep the same hypotheses when none ends before the forced
end, so beam outputs are compared with EOS forced at one fixed length (``max_len`` here,
``max_new_tokens`` and ``forced_eos_token_id`` there), no length penalty (alpha 0,
length_penalty 0), as n-best sets; greedy outputs (ids and text) with natural ends, one limit
per sentence.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers reads it: nothing from a hub
transformers = pytest.importorskip("transformers")

import torch
from marian_testkit import corpus, marian_folder

from transduce.checkpoint import load_model
from transduce.data.vocab import BOS, EOS, PAD, sides
from transduce.errors import UserError
from transduce.export.huggingface import export_marian, import_marian
from transduce.inference.beam import beam_search
from transduce.inference.engine import DecodingModel
from transduce.inference.greedy import greedy_search
from transduce.inference.translator import Translator

SOURCES = corpus(12, seed=7)[0]


def _loaded(root: Path, folder: Path) -> dict[str, Any]:
    """Import ``folder`` and load both sides."""
    summary = import_marian(folder, root / f"{folder.name}.pt")
    hf = transformers.MarianMTModel.from_pretrained(str(folder)).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    model, vocab, _ = load_model(root / f"{folder.name}.pt")
    pieces = vocab.pieces if hasattr(vocab, "pieces") else vocab.target.pieces
    order = {p: i for i, p in enumerate(pieces)}  # transduce id of each piece
    marian_ids = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    to_ours = {i: order.get(p) for p, i in marian_ids.items()}  # Marian id -> transduce id
    to_ours[marian_ids["</s>"]], to_ours[marian_ids["<unk>"]] = EOS, 3
    return {
        "root": root,
        "folder": folder,
        "summary": summary,
        "hf": hf,
        "tok": tok,
        "model": model,
        "vocab": vocab,
        "to_ours": to_ours,
    }


@pytest.fixture(scope="module")
def marian(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A Marian folder, its import, and both loaded."""
    root = tmp_path_factory.mktemp("marian")
    return _loaded(root, marian_folder(root / "opus"))


def _sources(m: dict[str, Any], texts: list[str]) -> torch.Tensor:
    """transduce's padded source ids (B, S), each ending in EOS."""
    ids = [m["vocab"].encode(t) + [EOS] for t in texts]
    width = max(map(len, ids))
    return torch.tensor([row + [PAD] * (width - len(row)) for row in ids])


def _hf_ids(m: dict[str, Any], row: list[int]) -> list[int]:
    """A generated Hugging Face row as transduce ids without start, EOS and padding."""
    out = []
    for i in row[1:]:
        t = m["to_ours"][i]
        if t == EOS:
            break
        out.append(t)
    return out


def test_import_keeps_the_marian_layout(marian: dict[str, Any]) -> None:
    s = marian["summary"]
    assert (s["activation"], s["shared_vocab"], s["tie_embeddings"], s["added_bos"]) == (
        "swish",
        True,
        True,
        True,
    )
    m = marian
    batch = m["tok"](SOURCES, return_tensors="pt", padding=True)
    ours = _sources(m, SOURCES)
    theirs = [[m["to_ours"][i] for i in row] for row in batch["input_ids"].tolist()]
    assert theirs == ours.tolist()  # same pieces, same ids, same padding


def _check_teacher_forced(m: dict[str, Any]) -> None:
    batch = m["tok"](SOURCES, text_target=corpus(12, seed=7)[1], return_tensors="pt", padding=True)
    labels = batch["labels"]  # (B, T) Marian ids, padded with the pad id
    pad = m["hf"].config.pad_token_id
    start = torch.full((labels.size(0), 1), m["hf"].config.decoder_start_token_id)
    decoder_in = torch.cat([start, labels[:, :-1]], 1)
    with torch.no_grad():
        hf = m["hf"](
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            decoder_input_ids=decoder_in,
        ).logits.log_softmax(-1)
        tgt = torch.tensor([[BOS] + [m["to_ours"][i] for i in row[:-1]] for row in labels.tolist()])
        ours = m["model"](_sources(m, SOURCES), tgt).log_softmax(-1)  # (B, T, V + 1)
    perm = torch.tensor([m["to_ours"][i] for i in range(hf.size(-1))])
    valid = labels != pad  # padded target positions are not compared
    assert torch.allclose(ours[..., perm][valid], hf[valid], atol=1e-4, rtol=0)
    assert float(ours[..., BOS].max()) < -1000  # the added BOS takes no probability


def test_teacher_forced_log_probs_equal(marian: dict[str, Any]) -> None:
    _check_teacher_forced(marian)


def test_target_text_is_split_by_target_spm(marian: dict[str, Any]) -> None:
    """``score`` and prefixes read target text as ``MarianTokenizer(text_target=...)`` does:
    split by target.spm (the shared vocabulary's source side splits by source.spm)."""
    m = marian
    translator = Translator(m["model"], m["vocab"], load_model(m["root"] / "opus.pt")[2])
    sources, targets = corpus(6, seed=7)
    target = sides(m["vocab"])[1]
    split_apart = 0
    for s, t in zip(sources, targets, strict=True):
        enc = m["tok"]([s], text_target=[t], return_tensors="pt")
        labels = enc["labels"][0].tolist()  # Marian ids, ending in </s>
        assert target.encode(t) + [EOS] == [m["to_ours"][i] for i in labels]
        split_apart += m["vocab"].encode(t) != target.encode(t)
        with torch.no_grad():  # HF's mean over the labels, the start token put before them
            loss = float(m["hf"](input_ids=enc["input_ids"], labels=enc["labels"]).loss)
        assert translator.score([s], [t])[0].log_prob == pytest.approx(
            -loss * len(labels), abs=1e-3
        )
    assert split_apart  # source.spm splits these targets otherwise: the test can tell
    prefix = " ".join(targets[0].split()[:2])
    out = translator.translate([sources[0]], prefixes=[prefix])[0]
    assert out.startswith(prefix)


@pytest.mark.parametrize("share", [True, False])
def test_untied_embeddings_import(tmp_path: Path, share: bool) -> None:
    """tie_word_embeddings off: the output layer apart, with shared source and target
    embeddings (transduce: two copies) or not; one vocab.json is one vocabulary either way."""
    folder = marian_folder(
        tmp_path / "untied", tie_word_embeddings=False, share_encoder_decoder_embeddings=share
    )
    m = _loaded(tmp_path, folder)
    assert (m["summary"]["shared_vocab"], m["summary"]["tie_embeddings"]) == (True, False)
    _check_teacher_forced(m)


def test_greedy_equals_generate(marian: dict[str, Any]) -> None:
    """Translator (the engine, a padded batch) against generate one sentence at a time, each
    with transduce's limit: source pieces + EOS + max_len_offset tokens, then EOS."""
    m, offset = marian, 5
    translator = Translator(m["model"], m["vocab"], load_model(m["root"] / "opus.pt")[2])
    texts = translator.translate(SOURCES, translator.decode_config(beam=1, max_len_offset=offset))
    ids = greedy_search(DecodingModel(m["model"]), _sources(m, SOURCES), max_len_offset=offset)
    ended = 0
    for k, text in enumerate(SOURCES):
        enc = m["tok"]([text], return_tensors="pt")
        limit = enc["input_ids"].size(1) + offset
        out = m["hf"].generate(**enc, num_beams=1, do_sample=False, max_new_tokens=limit + 1)
        assert _hf_ids(m, out[0].tolist()) == ids[k]
        assert m["tok"].decode(out[0], skip_special_tokens=True) == texts[k]
        ended += len(ids[k]) < limit
    assert 0 < ended < len(SOURCES)  # both natural ends and forced ones were compared


@pytest.mark.parametrize("beam", [4, 1])
def test_beam_equals_generate_at_a_fixed_length(
    marian: dict[str, Any], tmp_path: Path, beam: int
) -> None:
    """EOS only where forced: both beams hold the same W hypotheses at the end. Their order can
    differ: transduce counts the forced EOS's own log-probability, Hugging Face's forced EOS
    scores 0; so the n-best sets are compared, and the best one where the beam is 1."""
    folder = marian_folder(tmp_path / "long", eos_bias=-30.0)
    import_marian(folder, tmp_path / "long.pt")
    model, _, _ = load_model(tmp_path / "long.pt")
    hf = transformers.MarianMTModel.from_pretrained(str(folder)).eval()
    m, length = marian, 6
    batch = m["tok"](SOURCES, return_tensors="pt", padding=True)
    hyps = beam_search(
        DecodingModel(model), _sources(m, SOURCES), beam=beam, alpha=0.0, max_len=length, nbest=beam
    )
    out = hf.generate(
        **batch,
        num_beams=beam,
        length_penalty=0.0,
        do_sample=False,
        max_new_tokens=length + 1,
        early_stopping=False,
        num_return_sequences=beam,
    ).tolist()
    for k in range(len(SOURCES)):
        theirs = {tuple(_hf_ids(m, row)) for row in out[k * beam : (k + 1) * beam]}
        assert theirs == {tuple(h.tokens) for h in hyps[k]}
        assert all(len(h.tokens) == length for h in hyps[k])


def test_refusals_name_the_field(tmp_path: Path) -> None:
    folder = marian_folder(tmp_path / "m")
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    for key, value in (
        ("normalize_before", True),
        ("scale_embedding", False),
        ("static_position_embeddings", False),
        ("decoder_layers", 3),
        ("activation_function", "tanh"),
        ("activation_function", ["swish"]),  # not a string: no TypeError
    ):
        (folder / "config.json").write_text(json.dumps({**config, key: value}), encoding="utf-8")
        with pytest.raises(UserError, match=key) as e:
            import_marian(folder, tmp_path / "x.pt")
        assert "\n" not in str(e.value)


def _damaging(base: Path, root: Path) -> Any:
    """``damaged(name, **values)``: a copy of the Marian folder ``base`` as ``root / name``
    with ``values`` written over its config.json."""
    config = json.loads((base / "config.json").read_text(encoding="utf-8"))

    def damaged(name: str, **values: Any) -> Path:
        folder = root / name
        shutil.copytree(base, folder)
        (folder / "config.json").write_text(json.dumps({**config, **values}), encoding="utf-8")
        return folder

    return damaged


def test_damaged_folders_are_one_line(tmp_path: Path) -> None:
    """Damaged weights or config values: one line naming the folder or field, never a
    traceback, and never weights transformers made up (it fills a missing tensor at random)."""
    from safetensors.torch import load_file, save_file

    base = marian_folder(tmp_path / "base")
    damaged = _damaging(base, tmp_path)

    weights = load_file(str(base / "model.safetensors"))
    missing = damaged("missing")
    del weights["model.encoder.layers.0.fc1.weight"]
    save_file(weights, str(missing / "model.safetensors"), metadata={"format": "pt"})
    truncated = damaged("truncated")
    (truncated / "model.safetensors").write_bytes((base / "model.safetensors").read_bytes()[:3000])
    start = damaged("start", decoder_start_token_id=500)
    (start / "generation_config.json").unlink()  # (which would name the start token instead)
    for folder, needle in (
        (missing, "missing tensors: model.encoder.layers.0.fc1.weight"),
        (truncated, "cannot load the Marian weights"),
        (damaged("dropout", dropout=None), "dropout must be a number"),
        (damaged("tie", tie_word_embeddings="no"), "tie_word_embeddings must be true or false"),
        (start, "no id 500, the decoder's start"),
        (damaged("width", d_model=64), "shapes are not those config.json gives"),
        (damaged("size", vocab_size=500), re.escape(f"{tmp_path / 'size' / 'vocab.json'} has")),
    ):
        with pytest.raises(UserError, match=needle) as e:
            import_marian(folder, tmp_path / "x.pt")
        assert "\n" not in str(e.value)
    assert not (tmp_path / "x.pt").exists()


def test_export_then_generate_and_reimport(marian: dict[str, Any], tmp_path: Path) -> None:
    """The imported model out again: generate equals transduce's greedy output, the tokenizer
    and pipeline load, and importing the export gives the same outputs."""
    m = marian
    out = tmp_path / "hf"
    summary = export_marian(m["root"] / "opus.pt", out)
    files = {"config.json", "generation_config.json", "vocab.json", "source.spm", "target.spm"}
    assert files <= set(summary["files"])
    generation = json.loads((out / "generation_config.json").read_text(encoding="utf-8"))
    assert (generation["num_beams"], generation["length_penalty"]) == (4, 0.6)
    hf = transformers.MarianMTModel.from_pretrained(str(out)).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    translator = Translator.load(m["root"] / "opus.pt")
    texts = translator.translate(SOURCES, translator.decode_config(beam=1, max_len_offset=5))
    for k, text in enumerate(SOURCES):
        enc = tok([text], return_tensors="pt")
        gen = hf.generate(**enc, num_beams=1, max_new_tokens=enc["input_ids"].size(1) + 6)
        assert tok.decode(gen[0], skip_special_tokens=True) == texts[k]
    try:  # transformers 5 removed the translation pipeline (4.x has it)
        pipe = transformers.pipeline("translation", model=str(out), num_beams=1, max_new_tokens=12)
    except KeyError:
        pipe = None
    if pipe is not None:
        assert pipe(SOURCES[0])[0]["translation_text"] == texts[0]
    import_marian(out, tmp_path / "again.pt")
    again = Translator.load(tmp_path / "again.pt")
    assert again.translate(
        SOURCES, again.decode_config(beam=4, max_len_offset=5)
    ) == translator.translate(SOURCES, translator.decode_config(beam=4, max_len_offset=5))


def test_imported_model_exports_to_ctranslate2(marian: dict[str, Any], tmp_path: Path) -> None:
    """An imported file is an ordinary model file: CTranslate2's export takes it (swish, the
    logits bias, source.spm to split and target.spm to join) and greedy agrees."""
    ct2 = pytest.importorskip("transduce.export.ctranslate2")
    pytest.importorskip("ctranslate2")
    ct2.export_checkpoint(marian["root"] / "opus.pt", tmp_path / "ct2")
    theirs = ct2.translate_with_ctranslate2(
        tmp_path / "ct2", SOURCES, beam_size=1, max_len_offset=5
    )
    ours = (t := Translator.load(marian["root"] / "opus.pt")).translate(
        SOURCES, t.decode_config(beam=1, max_len_offset=5)
    )
    # where EOS is the first choice (an empty output) CTranslate2 with suppress_sequences goes
    # on (measured: without it, it ends there too): those lines are left out
    kept = [k for k, text in enumerate(ours) if text]
    assert len(kept) > len(SOURCES) // 2
    assert [theirs[k] for k in kept] == [ours[k] for k in kept]


def test_a_language_code_reaches_ctranslate2_as_one_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A multilingual OPUS-MT model's >>fra<< is one token on every path: MarianTokenizer's,
    the import's and the CTranslate2 export's (SentencePiece alone splits it)."""
    pytest.importorskip("ctranslate2")
    import marian_testkit

    from transduce.export.ctranslate2 import export_checkpoint, translate_with_ctranslate2

    plain = marian_testkit.joint_vocab

    def with_code(source: bytes, target: bytes) -> dict[str, int]:
        vocab = plain(source, target)
        pad = vocab.pop("<pad>")  # the padding stays the last id (the folder's start token)
        vocab[">>fra<<"] = pad
        vocab["<pad>"] = pad + 1
        return vocab

    monkeypatch.setattr(marian_testkit, "joint_vocab", with_code)
    folder = marian_testkit.marian_folder(tmp_path / "multi")
    import_marian(folder, tmp_path / "multi.pt")
    translator = Translator.load(tmp_path / "multi.pt")
    texts = [f">>fra<< {t}" for t in SOURCES]
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert (
        tok.tokenize(texts[0])[0]
        == ">>fra<<"
        == translator.vocab.id_to_piece(translator.vocab.encode(texts[0])[0])
    )
    export_checkpoint(tmp_path / "multi.pt", tmp_path / "ct2")
    ours = translator.translate(texts, translator.decode_config(beam=1, max_len_offset=5))
    theirs = translate_with_ctranslate2(tmp_path / "ct2", texts, beam_size=1, max_len_offset=5)
    kept = [k for k, text in enumerate(ours) if text]  # (as above: EOS first is left out)
    assert len(kept) >= len(texts) // 2
    assert [theirs[k] for k in kept] == [ours[k] for k in kept]


def test_more_damaged_folders_are_one_line(tmp_path: Path) -> None:
    """What an audit found: a decoder_vocab_size or a tokenizer token of the wrong type (a
    traceback), tensors beyond what config.json describes or NaN weights (imported without a
    word), a bad target.spm called the source model, and files unnamed in the messages."""
    from safetensors.torch import load_file, save_file

    base = marian_folder(tmp_path / "base")
    tok = json.loads((base / "tokenizer_config.json").read_text(encoding="utf-8"))
    damaged = _damaging(base, tmp_path)

    extra = damaged("extra")
    weights = load_file(str(base / "model.safetensors"))
    weights["model.encoder.layers.2.fc1.weight"] = weights[
        "model.encoder.layers.0.fc1.weight"
    ].clone()
    save_file(weights, str(extra / "model.safetensors"), metadata={"format": "pt"})
    nan = damaged("nan")
    weights = load_file(str(base / "model.safetensors"))
    weights["model.encoder.layers.0.fc1.weight"][0, 0] = float("nan")
    save_file(weights, str(nan / "model.safetensors"), metadata={"format": "pt"})
    listed = damaged("listed")
    (listed / "tokenizer_config.json").write_text(
        json.dumps({**tok, "pad_token": ["<pad>"]}), encoding="utf-8"
    )
    spm = damaged("spm")
    (spm / "target.spm").write_bytes(b"garbage")
    split = {"share_encoder_decoder_embeddings": False}
    for folder, needle in (
        (damaged("size", **split, decoder_vocab_size="77"), "decoder_vocab_size must be a pos"),
        (listed, "tokenizer_config.json: pad_token must be a token"),
        (extra, "unexpected tensors: model.encoder.layers.2.fc1.weight"),
        (nan, "weights hold NaN or infinity"),
        (spm, f"{spm / 'target.spm'}: not a SentencePiece model"),
        (damaged("positions", max_position_embeddings=None), "config.json: model.max_positions"),
    ):
        with pytest.raises(UserError, match=re.escape(needle)) as e:
            import_marian(folder, tmp_path / "x.pt")
        assert "\n" not in str(e.value)
        assert str(folder) in str(e.value), str(e.value)  # the folder or its file named
    assert not (tmp_path / "x.pt").exists()


def test_the_output_is_new_unless_forced_and_safetensors_by_its_name(tmp_path: Path) -> None:
    folder = marian_folder(tmp_path / "m")
    (tmp_path / "taken.pt").write_text("mine", encoding="utf-8")
    with pytest.raises(UserError, match="taken.pt exists; --force replaces it"):
        import_marian(folder, tmp_path / "taken.pt")
    assert (tmp_path / "taken.pt").read_text(encoding="utf-8") == "mine"
    import_marian(folder, tmp_path / "taken.pt", force=True)
    (tmp_path / "d").mkdir()
    with pytest.raises(UserError, match=r"d: is a folder"):
        import_marian(folder, tmp_path / "d", force=True)
    import_marian(folder, tmp_path / "m.safetensors")
    assert (tmp_path / "m.safetensors").read_bytes()[:2] != b"PK"  # not a torch archive
    one, other = Translator.load(tmp_path / "taken.pt"), Translator.load(tmp_path / "m.safetensors")
    assert one.translate(SOURCES) == other.translate(SOURCES)


def test_bad_decoding_settings_and_tokenizer_flags_are_refused_not_replaced(tmp_path: Path) -> None:
    folder = marian_folder(tmp_path / "m")
    generation = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
    for key, value in (("num_beams", 0), ("num_beams", "x"), ("transduce_alpha", -3)):
        bad = {**generation, key: value}
        (folder / "generation_config.json").write_text(json.dumps(bad), encoding="utf-8")
        with pytest.raises(UserError, match=r"generation_config.json: .*(num_beams|alpha)") as e:
            import_marian(folder, tmp_path / "x.pt", force=True)
        assert "\n" not in str(e.value)  # one line (it was 4 or 0.6, silently)
    (folder / "generation_config.json").write_text(json.dumps(generation), encoding="utf-8")
    tokenizer = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    tokenizer["separate_vocabs"] = "false"  # a string: it read as true
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer), encoding="utf-8")
    with pytest.raises(UserError, match="separate_vocabs 'false'; expected true or false"):
        import_marian(folder, tmp_path / "x.pt", force=True)
