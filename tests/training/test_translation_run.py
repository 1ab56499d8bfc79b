"""train_translation / train: files -> vocabulary -> Trainer, reports, resume, TensorBoard.

A toy parallel corpus generated here (source words -> the same words upper-cased, in reverse
order) keeps these tests independent of any data set; learning real translation is tested end
to end on Multi30k in tests/cli/test_translation_cli.py.
"""

from __future__ import annotations

import gzip
import json
import random
import sys
from pathlib import Path

import pytest
from training_testkit import records

from transduce import checkpoint
from transduce.config import SyntheticTaskConfig, TranslationTaskConfig, from_dict, update
from transduce.data.parallel import resolve_data_path
from transduce.data.subword import SentencePieceVocab
from transduce.errors import UserError
from transduce.training import run
from transduce.training.run import train, train_translation
from transduce.training.tasks.translation_files import bpe_dropout_pairs

WORDS = "the a dog cat man woman runs sits on in red blue big small park street ball".split()


def write_corpus(folder: Path, n: int = 200, seed: int = 0, *, gz: bool = False) -> dict[str, str]:
    """Toy parallel files; line 5 of the source is empty (that pair must be skipped)."""
    rng = random.Random(seed)
    src, tgt = [], []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, 6))]
        src.append(" ".join(words))
        tgt.append(" ".join(w.upper() for w in reversed(words)))
    src[4] = ""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, lines in {
        "train.src": src,
        "train.tgt": tgt,
        "valid.src": src[:20],
        "valid.tgt": tgt[:20],
    }.items():
        data = "".join(line + "\n" for line in lines).encode("utf-8")
        path = folder / (name + (".gz" if gz else ""))
        path.write_bytes(gzip.compress(data) if gz else data)
        paths[name.replace(".", "_")] = str(path)
    return paths


def tiny_config(paths: dict[str, str], **train_overrides):  # noqa: ANN201
    train_cfg = {
        "max_steps": 12,
        "warmup": 10,
        "max_tokens": 400,
        "eval_every": 6,
        "save_every": 6,
        "keep_last": 2,
        "average_last": 2,
        "log_every": 3,
        "valid_beam": 1,
    }
    train_cfg.update(train_overrides)
    return from_dict(
        {
            "model": {
                "n_layers": 1,
                "d_model": 32,
                "d_ff": 64,
                "n_heads": 2,
                "d_k": 16,
                "d_v": 16,
                "dropout": 0.0,
            },
            "train": train_cfg,
            "task": {
                "name": "translation",
                "train_src": paths["train_src"],
                "train_tgt": paths["train_tgt"],
                "valid_src": paths["valid_src"],
                "valid_tgt": paths["valid_tgt"],
                "vocab_size": 60,
            },
            "decode": {"max_len_offset": 5},
        }
    )


# A model that learns the toy task (the words reversed, upper-cased) in a few seconds: 400
# updates reach a validation BLEU of 54 and chrF 84 on one thread, as the tests run (seeds 1-4:
# BLEU 44-76, chrF 67-85; on two threads 30-64 and 60-83), from 13-15 and 48-56 at update 200;
# fp32 for the same numbers on CPUs with and without bfloat16
LEARNS = {
    "d_model": 64,
    "d_ff": 128,
    "n_heads": 4,
    "d_k": 16,
    "d_v": 16,
    "label_smoothing": 0.0,
    "warmup": 100,
    "precision": "fp32",
}


def test_run_folder_vocab_metrics_and_report(tmp_path) -> None:
    paths = write_corpus(tmp_path / "data", gz=True)
    logged: list[str] = []
    out = tmp_path / "run"
    cfg = update(tiny_config(paths, max_steps=400, eval_every=200, save_every=200), LEARNS)
    summary = train_translation(cfg, out, show_progress=False, log=logged.append)

    assert summary["step"] == 400 and summary["stopped_by"] == "max_steps"
    assert summary["train_pairs"] == 199 and summary["train_skipped_empty"] == 1
    assert summary["valid_pairs"] == 19 and summary["valid_skipped_empty"] == 1
    assert summary["vocab_size"] == 60 and "bleu" in summary and "chrf" in summary
    report = "\n".join(logged)
    assert "train: 199 sentence pairs" in report and "1 with an empty side skipped" in report
    assert paths["train_src"] in report and "vocabulary: 60" in report

    vocab = SentencePieceVocab.load(out / "vocab.model")
    for name in ("model.pt", "best.pt"):
        data = checkpoint.load(out / name)
        assert data["vocab"] == vocab.to_dict()  # the checkpoint alone can translate
        assert data["config"]["task"]["name"] == "translation"
    valid = [r for r in records(out) if r.get("split") == "valid"]
    assert [r["step"] for r in valid] == [200, 400]
    for r in valid:
        assert {"bleu", "chrf", "valid_loss", "valid_ppl"} <= set(r)
        assert r["valid_ppl"] > 1.0
    first, last = valid
    assert last["bleu"] >= 20.0 and last["chrf"] >= 50.0, valid  # it learnt the task
    assert last["bleu"] > first["bleu"] and last["valid_loss"] < first["valid_loss"], valid
    assert json.loads((out / "config.json").read_text())["task"]["vocab_size"] == 60


def test_resume_reuses_vocab_model(tmp_path, monkeypatch) -> None:
    paths = write_corpus(tmp_path / "data")
    out = tmp_path / "run"
    train_translation(tiny_config(paths, max_steps=6), out, show_progress=False, log=lambda _: None)
    saved = (out / "vocab.model").read_bytes()

    def refuse(*args, **kwargs):
        raise AssertionError("resume must reuse vocab.model, not learn a new vocabulary")

    monkeypatch.setattr("transduce.data.subword.train_sentencepiece", refuse)
    logged: list[str] = []
    summary = train_translation(
        tiny_config(paths, max_steps=12), out, resume=True, show_progress=False, log=logged.append
    )
    assert summary["step"] == 12
    assert (out / "vocab.model").read_bytes() == saved
    assert any("resumed run" in line for line in logged)
    steps = [r["step"] for r in records(out) if "loss" in r]
    assert steps == sorted(steps) and steps[-1] == 12


def test_vocab_sample_learns_on_a_sample(tmp_path, monkeypatch) -> None:
    import transduce.data.subword as subword

    learn = subword.train_sentencepiece
    seen: list[int] = []

    def spy(texts, size, **kwargs):  # noqa: ANN001, ANN003, ANN202
        seen.append(kwargs["input_sentence_size"])
        return learn(texts, size, **kwargs)

    monkeypatch.setattr(subword, "train_sentencepiece", spy)
    paths = write_corpus(tmp_path / "data")
    cfg = tiny_config(paths, max_steps=1, eval_every=0)
    logged: list[str] = []
    train_translation(cfg, tmp_path / "all", show_progress=False, log=logged.append)
    sampled = from_dict({**cfg.to_dict(), "task": {**cfg.to_dict()["task"], "vocab_sample": 150}})
    train_translation(sampled, tmp_path / "sample", show_progress=False, log=logged.append)
    assert seen == [0, 150]  # 0: every sentence (398 here)
    reports = [line for line in logged if line.startswith("vocabulary:")]
    assert len(reports) == 2 and "a sample" not in reports[0]
    assert "(a sample of 150 sentences)" in reports[1]
    assert len(SentencePieceVocab.load(tmp_path / "sample" / "vocab.model")) == 60


def test_bpe_dropout_segments_the_training_text_anew_each_epoch(tmp_path, monkeypatch) -> None:
    from transduce.data.parallel import read_parallel

    sample = SentencePieceVocab.sample_batch
    drawn: list[tuple[int, float, int]] = []  # (sentences, dropout, seed) of each draw

    def spy(self, texts, *, dropout, seed):  # noqa: ANN001, ANN202
        drawn.append((len(texts), dropout, seed))
        return sample(self, texts, dropout=dropout, seed=seed)

    monkeypatch.setattr(SentencePieceVocab, "sample_batch", spy)
    paths = write_corpus(tmp_path / "data")
    plain_cfg = tiny_config(paths)
    cfg = from_dict(
        {**plain_cfg.to_dict(), "task": {**plain_cfg.to_dict()["task"], "bpe_dropout": 0.3}}
    )
    out = tmp_path / "run"
    summary = train_translation(cfg, out, show_progress=False, log=lambda _: None)
    assert summary["step"] == 12 and summary["epoch"] >= 1  # 12 steps span several epochs
    # each epoch begun: source and target drawn once each, all 199 pairs, seeds all different
    assert len(drawn) == 2 * (summary["epoch"] + 1)
    assert {(n, p) for n, p, _ in drawn} == {(199, 0.3)}
    assert len({seed for _, _, seed in drawn}) == len(drawn)

    vocab = SentencePieceVocab.load(out / "vocab.model")
    text = read_parallel(Path(paths["train_src"]), Path(paths["train_tgt"]))
    assert bpe_dropout_pairs(plain_cfg, vocab, text) is None
    epoch_pairs = bpe_dropout_pairs(cfg, vocab, text)
    first = epoch_pairs(0)
    assert epoch_pairs(1) != first and epoch_pairs(0) == first  # a resumed run draws the same
    plain = list(zip(vocab.encode_batch(text.source), vocab.encode_batch(text.target)))
    assert first != plain
    assert [vocab.decode(s) for s, _ in first] == [vocab.decode(s) for s, _ in plain]
    assert [vocab.decode(t) for _, t in first] == list(text.target)


def test_a_resumed_bpe_dropout_run_says_it_segments_otherwise(tmp_path, capsys) -> None:
    # SentencePiece's samples differ between processes: the resume cannot be exact, and says so
    paths = write_corpus(tmp_path / "data")
    plain = tiny_config(paths).to_dict()
    cfg = from_dict({**plain, "task": {**plain["task"], "bpe_dropout": 0.3}})
    out = tmp_path / "run"
    train_translation(cfg, out, show_progress=False, log=lambda _: None)
    capsys.readouterr()
    longer = from_dict({**cfg.to_dict(), "train": {**cfg.to_dict()["train"], "max_steps": 14}})
    train_translation(longer, out, resume=True, show_progress=False, log=lambda _: None)
    said = capsys.readouterr().err
    assert "bpe_dropout: SentencePiece's BPE-dropout samples differ" in said
    assert "goes on with the pieces saved in the checkpoint" in said  # its epoch's draw
    train_translation(from_dict(plain), tmp_path / "plain", show_progress=False, log=print)
    plain_longer = {**plain, "train": {**plain["train"], "max_steps": 14}}
    train_translation(
        from_dict(plain_longer), tmp_path / "plain", resume=True, show_progress=False, log=print
    )
    assert "BPE-dropout samples differ" not in capsys.readouterr().err


def test_paths_expand_environment_variables(tmp_path, monkeypatch) -> None:
    write_corpus(tmp_path / "data")
    monkeypatch.setenv("TOY_CORPUS", str(tmp_path))
    assert resolve_data_path("${TOY_CORPUS}/data/train.src", "train_src") == (
        tmp_path / "data" / "train.src"
    )
    monkeypatch.delenv("TOY_CORPUS")
    with pytest.raises(UserError, match="TOY_CORPUS is not set") as e:
        resolve_data_path("${TOY_CORPUS}/data/train.src", "train_src")
    assert "train_src" in str(e.value)


def test_relative_paths_are_relative_to_the_current_directory(tmp_path, monkeypatch) -> None:
    write_corpus(tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    keys = ("train_src", "train_tgt", "valid_src", "valid_tgt")
    rel = {k: f"data/{k.replace('_', '.')}" for k in keys}
    summary = train_translation(
        tiny_config(rel, max_steps=3, eval_every=0, average_last=0),
        "run",
        show_progress=False,
        log=lambda _: None,
    )
    assert summary["train_pairs"] == 199 and (tmp_path / "run" / "model.pt").is_file()


def test_corpus_errors_name_file_and_line(tmp_path) -> None:
    paths = write_corpus(tmp_path / "data")
    with open(paths["train_tgt"], "a", encoding="utf-8") as f:
        f.write("ONE MORE\n")
    with pytest.raises(UserError, match="200 lines.*201 lines") as e:
        train_translation(tiny_config(paths), tmp_path / "run", log=lambda _: None)
    assert paths["train_src"] in str(e.value) and paths["train_tgt"] in str(e.value)

    paths = write_corpus(tmp_path / "data2")
    raw = Path(paths["valid_src"]).read_bytes().split(b"\n")
    raw[2] = b"caf\xe9"  # Latin-1, not UTF-8
    Path(paths["valid_src"]).write_bytes(b"\n".join(raw))
    with pytest.raises(UserError, match="line 3: invalid UTF-8") as e:
        train_translation(tiny_config(paths), tmp_path / "run", log=lambda _: None)
    assert paths["valid_src"] in str(e.value)

    missing = dict(paths, train_tgt=str(tmp_path / "nope.tgt"))
    with pytest.raises(UserError, match="^task.train_tgt: .*nope.tgt: no such file"):
        train_translation(tiny_config(missing), tmp_path / "run", log=lambda _: None)
    lines: list[str] = []  # a missing validation file: said before the training text is read
    missing = dict(paths, valid_src=str(tmp_path / "nope.src"))
    with pytest.raises(UserError, match="^task.valid_src: .*nope.src: no such file"):
        train_translation(tiny_config(missing), tmp_path / "run", log=lines.append)
    assert not any("sentence pairs from" in line for line in lines)


def test_missing_settings(tmp_path) -> None:
    paths = write_corpus(tmp_path / "data")
    with pytest.raises(UserError, match="train_src"):
        train_translation(tiny_config(dict(paths, train_src="")), tmp_path / "run")
    with pytest.raises(UserError, match="valid_tgt"):
        from_dict({"task": {"name": "translation", "valid_src": "x"}})
    with pytest.raises(UserError, match="vocab_size"):
        from_dict({"task": {"vocab_size": 0}})
    with pytest.raises(UserError, match="valid_beam"):
        from_dict({"train": {"valid_beam": 0}})
    too_big = from_dict(
        {
            **tiny_config(paths).to_dict(),
            "task": {**tiny_config(paths).to_dict()["task"], "vocab_size": 5000},
        }
    )
    with pytest.raises(UserError, match="vocab_size 5000 is too large"):
        train_translation(too_big, tmp_path / "run", log=lambda _: None)
    with pytest.raises(UserError, match="longer than max_len=2"):
        train_translation(tiny_config(paths, max_len=2), tmp_path / "run", log=lambda _: None)


def test_without_validation_files(tmp_path) -> None:
    paths = dict(write_corpus(tmp_path / "data"), valid_src="", valid_tgt="")
    logged: list[str] = []
    summary = train_translation(
        tiny_config(paths, max_steps=3, average_last=0),
        tmp_path / "run",
        show_progress=False,
        log=logged.append,
    )
    assert summary["step"] == 3 and (tmp_path / "run" / "model.pt").is_file()
    assert any("no validation files" in line for line in logged)


def test_train_dispatches_by_task(tmp_path, monkeypatch) -> None:
    calls = []
    monkeypatch.setitem(
        run.TASKS, SyntheticTaskConfig, lambda cfg, out, **kw: calls.append("synthetic")
    )
    monkeypatch.setitem(
        run.TASKS, TranslationTaskConfig, lambda cfg, out, **kw: calls.append("translate")
    )
    train(from_dict({"task": {"name": "copy"}}), tmp_path)
    train(from_dict({"task": {"name": "translation"}}), tmp_path)
    assert calls == ["synthetic", "translate"]


def test_tensorboard_event_files(tmp_path) -> None:
    pytest.importorskip("tensorboard", reason="tensorboard is an optional dependency")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    paths = write_corpus(tmp_path / "data")
    out = tmp_path / "run"
    train_translation(tiny_config(paths), out, show_progress=False, log=lambda _: None)
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/tokens_per_s", "valid/bleu", "valid/valid_ppl"} <= tags
    assert [e.step for e in events.Scalars("valid/bleu")] == [6, 12]


def test_without_tensorboard_a_notice_and_training_goes_on(tmp_path, monkeypatch, capsys) -> None:
    from transduce.training import metrics_log

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    monkeypatch.setattr(metrics_log, "_tensorboard_notice_shown", False)
    paths = write_corpus(tmp_path / "data")
    for name in ("run1", "run2"):
        summary = train_translation(
            tiny_config(paths, max_steps=3, average_last=0),
            tmp_path / name,
            show_progress=False,
            log=lambda _: None,
        )
        assert summary["step"] == 3
        assert not (tmp_path / name / "tensorboard").exists()
    assert capsys.readouterr().err.count("tensorboard is not installed") == 1


def test_tensorboard_can_be_switched_off(tmp_path) -> None:
    paths = write_corpus(tmp_path / "data")
    train_translation(
        tiny_config(paths, max_steps=2, average_last=0, tensorboard=False),
        tmp_path / "run",
        show_progress=False,
        log=lambda _: None,
    )
    assert not (tmp_path / "run" / "tensorboard").exists()


def test_separate_vocabularies_per_side(tmp_path) -> None:
    from dataclasses import replace

    from transduce.data.vocab import VocabPair
    from transduce.inference.translator import Translator

    paths = write_corpus(tmp_path / "data")
    base = tiny_config(paths, max_steps=6, eval_every=6, save_every=3)
    cfg = replace(base, task=replace(base.task, shared_vocab=False, vocab_size=40))
    out = tmp_path / "run"
    train_translation(cfg, out, show_progress=False, log=lambda m: None)
    assert (out / "vocab.src.model").is_file() and (out / "vocab.tgt.model").is_file()
    model, vocab, _ = checkpoint.load_model(out / "model.pt")
    assert isinstance(vocab, VocabPair) and len(vocab.source) == len(vocab.target) == 40
    src_pieces = {vocab.source.id_to_piece(i) for i in range(40)}  # type: ignore[attr-defined]
    tgt_pieces = {vocab.target.id_to_piece(i) for i in range(40)}  # type: ignore[attr-defined]
    assert "▁DOG" in tgt_pieces and "▁DOG" not in src_pieces  # each side learned on its own text
    # two embeddings, the target's tied to the output layer
    assert model.encoder.embed.weight is not model.decoder.embed.weight
    assert model.generator.weight is model.decoder.embed.weight
    assert len(Translator(model, vocab, cfg).translate(["the dog runs"])) == 1
    resumed = replace(cfg, train=replace(cfg.train, max_steps=9))
    summary = train_translation(resumed, out, resume=True, show_progress=False, log=lambda m: None)
    assert summary["step"] == 9


@pytest.mark.parametrize("shared_first", [True, False])
def test_resume_refuses_the_other_vocabulary_layout_before_learning_one(
    tmp_path, monkeypatch, shared_first: bool
) -> None:
    # a run of one shared vocabulary resumed with shared_vocab false (or the reverse): refused
    # in one line before any vocabulary is learned, and nothing written into the run folder
    paths = write_corpus(tmp_path / "data")
    out = tmp_path / "run"
    first = update(tiny_config(paths, max_steps=6), {"shared_vocab": shared_first})
    train_translation(first, out, show_progress=False, log=lambda _: None)
    files = sorted(p.name for p in out.iterdir())

    def refuse(*args, **kwargs):
        raise AssertionError("a refused resume must not learn a vocabulary")

    monkeypatch.setattr("transduce.data.subword.train_sentencepiece", refuse)
    other = update(first, {"shared_vocab": not shared_first, "max_steps": 12})
    with pytest.raises(UserError, match="keeps its checkpoint's vocabulary") as e:
        train_translation(other, out, resume=True, show_progress=False, log=lambda _: None)
    assert "\n" not in str(
        e.value
    ) and f"shared_vocab is now {str(not shared_first).lower()}" in str(e.value)
    assert sorted(p.name for p in out.iterdir()) == files


def test_a_resume_on_other_training_text_is_refused(tmp_path, capsys) -> None:
    paths = write_corpus(tmp_path / "data")
    out = tmp_path / "run"
    train_translation(tiny_config(paths, max_steps=4), out, show_progress=False, log=lambda _: None)
    assert json.loads((out / "training_text.json").read_text())["pairs"] > 0
    other = write_corpus(tmp_path / "other", n=20, seed=3)  # where the first run's files were
    for key in ("train_src", "train_tgt"):
        Path(paths[key]).write_bytes(Path(other[key]).read_bytes())
    with pytest.raises(UserError, match="not the training text this run started with"):
        train_translation(
            tiny_config(paths, max_steps=8), out, resume=True, show_progress=False, log=print
        )
    # other files, allowed by name: taken, and recorded for the next resume; a resume refused
    # for another reason (train_tgt moved, not allowed) records nothing
    moved = {**paths, **{k: v for k, v in other.items() if k.startswith("train")}}
    with pytest.raises(UserError, match="train_tgt"):
        train_translation(
            tiny_config(moved, max_steps=6), out, resume=True, allow_change=["train_src"], log=print
        )
    assert json.loads((out / "training_text.json").read_text())["pairs"] == 199
    allow = ["train_src", "train_tgt"]
    summary = train_translation(
        tiny_config(moved, max_steps=6), out, resume=True, allow_change=allow, log=lambda _: None
    )
    assert summary["step"] == 6
    assert json.loads((out / "training_text.json").read_text())["pairs"] == 19
    (out / "training_text.json").write_text("{damaged", encoding="utf-8")
    with pytest.raises(UserError, match="training_text.json: cannot read the run's record"):
        train_translation(
            tiny_config(moved, max_steps=8), out, resume=True, show_progress=False, log=print
        )
    (out / "training_text.json").unlink()  # no record: resumed, and said
    train_translation(
        tiny_config(moved, max_steps=8), out, resume=True, show_progress=False, log=print
    )
    assert "training_text.json is missing: this resume cannot check" in capsys.readouterr().err


def test_a_resume_restores_missing_vocabulary_files_from_its_checkpoint(tmp_path) -> None:
    """A resumed run without vocab.model learned a vocabulary anew (of another sample: other
    pieces) and wrote it into the run, then refused to resume with it."""
    paths = write_corpus(tmp_path / "data")
    out = tmp_path / "run"
    train_translation(tiny_config(paths, max_steps=4), out, show_progress=False, log=lambda _: None)
    before = (out / "vocab.model").read_bytes()
    (out / "vocab.model").unlink()
    lines: list[str] = []
    summary = train_translation(
        tiny_config(paths, max_steps=6), out, resume=True, show_progress=False, log=lines.append
    )
    assert summary["step"] == 6 and (out / "vocab.model").read_bytes() == before
    assert any("vocab.model missing, restored from" in line for line in lines)
