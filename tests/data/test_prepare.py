"""transduce prepare: cleaning counts, the ids on disk, shards, the manifest, the checks on
opening, and training (and resuming) from a prepared folder."""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from transduce.cli.main import main
from transduce.config import Config, load_config
from transduce.data.batching import length_index, select_pairs, token_batches
from transduce.data.prepare import prepare
from transduce.data.prepared import PreparedSplit, read_manifest
from transduce.data.subword import SentencePieceVocab
from transduce.errors import UserError

WORDS = "the a house cat dog runs sees big small red blue green tree river walks over".split()
CONFIG = """
model: {n_layers: 1, d_model: 32, d_ff: 64, n_heads: 2, d_k: 16, d_v: 16, dropout: 0.0}
train: {max_tokens: 300, warmup: 10, max_steps: 6, log_every: 1, save_every: 3, eval_every: 0,
        keep_last: 3, tensorboard: false, device: cpu, max_len: 40}
task: {name: translation, train_src: DIR/train.src, train_tgt: DIR/train.tgt,
       valid_src: DIR/valid.src, valid_tgt: DIR/valid.tgt, vocab_size: 60}
decode: {beam: 1}
"""


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def write_corpus(folder: Path, n: int = 600, seed: int = 0) -> dict[str, int]:
    """A toy parallel corpus with known defects; returns how many of each it holds."""
    rng = random.Random(seed)
    src, tgt = [], []
    for _ in range(n):
        s = _sentence(rng, rng.randint(2, 12))
        src.append(s)
        tgt.append(s.upper())
    defects = {"empty": 3, "identical": 4, "duplicate": 5, "too_long": 2, "ratio": 3}
    src += ["", "a tree", ""]
    tgt += ["A TREE", "", ""]
    src += ["same words here"] * 4
    tgt += ["same words here"] * 4
    src += [src[0]] * 5
    tgt += [tgt[0]] * 5
    src += [_sentence(rng, 80)] * 1 + [_sentence(rng, 90)]
    tgt += [_sentence(rng, 80).upper()] + [_sentence(rng, 90).upper()]
    src += ["the cat", "a dog", "big"]
    tgt += [_sentence(rng, 9).upper() for _ in range(3)]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.src").write_text("\n".join(src) + "\n")
    (folder / "train.tgt").write_text("\n".join(tgt) + "\n")
    (folder / "valid.src").write_text("\n".join(src[:20]) + "\n\n")
    (folder / "valid.tgt").write_text("\n".join(tgt[:20]) + "\nX\n")
    return defects


def config(folder: Path, **task: object) -> Config:
    path = folder / "run.yaml"
    path.write_text(CONFIG.replace("DIR", str(folder)))
    cfg = load_config(path)
    from transduce.config import update

    return update(cfg, {k: v for k, v in task.items()})


CLEAN = {"clean_max_len": 50, "clean_ratio": 2.5, "clean_identical": True, "clean_dedup": True}


def _prepared_clean(folder: Path) -> dict:
    """The toy corpus in ``folder``, prepared with every filter into ``folder / "p"``: the
    manifest."""
    write_corpus(folder)
    return prepare(
        config(folder, **CLEAN),
        folder / "p",
        workers=1,
        shard_pairs=100,
        show_progress=False,
        log=lambda _: None,
    )


def test_cleaning_counts_and_ids(tmp_path: Path) -> None:
    m = _prepared_clean(tmp_path)
    removed = m["splits"]["train"]["removed"]
    lines = [(tmp_path / f"train.{side}").read_text().splitlines() for side in ("src", "tgt")]
    pairs = [(s, t) for s, t in zip(*lines, strict=True) if s and t]
    # dedup comes first: of the 4 identical pairs, 3 are repeats; the corpus repeats others
    assert removed["empty"] == 3 and removed["identical"] == 1
    assert removed["duplicate"] == len(pairs) - len(set(pairs)) >= 5 + 3
    vocab = SentencePieceVocab.load(tmp_path / "p" / "vocab.model")
    lens = [(len(vocab.encode(s)), len(vocab.encode(t))) for s, t in dict.fromkeys(pairs) if s != t]
    too_long = [n for n in lens if max(n) > 50]
    assert removed["too_long"] == len(too_long) >= 2
    assert removed["ratio"] == sum(max(n) > 2.5 * min(n) for n in lens if max(n) <= 50) >= 3
    train = PreparedSplit(tmp_path / "p", "train")
    assert len(train) == m["splits"]["train"]["pairs"] == 617 - sum(removed.values())
    assert len(m["splits"]["train"]["shards"]) == -(-len(train) // 100)
    assert m["dtype"] == "uint16" and m["vocab"]["sizes"] == [60]
    assert (
        m["inputs"]["train_src"]["lines"] == 617 and len(m["inputs"]["train_src"]["sha256"]) == 64
    )
    assert m["cleaning"] == {
        "empty": True,
        "max_len": 50,
        "ratio": 2.5,
        "identical": True,
        "dedup": True,
    }
    # The ids are SentencePiece's for the kept pairs, in input order.
    first = (tmp_path / "train.src").read_text().splitlines()[0]
    assert train[0][0] == vocab.encode(first)
    assert train[-1] == train[len(train) - 1]
    for s, t in train:
        assert (
            0 < len(s) <= 50
            and 0 < len(t) <= 50
            and max(len(s), len(t)) <= 2.5 * min(len(s), len(t))
        )
    expected = np.array([[len(s) + 1, len(t) + 1] for s, t in train])
    assert (train.model_lengths() == expected).all()
    # The validation split keeps all but the empty pair, with its text for BLEU.
    valid = PreparedSplit(tmp_path / "p", "valid")
    assert len(valid) == 20 and m["splits"]["valid"]["removed"]["empty"] == 1
    assert (tmp_path / "p" / "valid.src.txt").read_text().splitlines()[0] == first


def test_workers_write_the_same_files(tmp_path: Path) -> None:
    write_corpus(tmp_path)
    cfg = config(tmp_path, **CLEAN)
    one = prepare(
        cfg, tmp_path / "one", workers=1, shard_pairs=250, show_progress=False, log=lambda _: None
    )
    two = prepare(
        config(tmp_path, **CLEAN, vocab_model=str(tmp_path / "one")),
        tmp_path / "two",
        workers=2,
        shard_pairs=250,
        show_progress=False,
        log=lambda _: None,
    )
    assert one["splits"]["train"]["shards"] == two["splits"]["train"]["shards"]
    assert two["vocab"]["source"] == str(tmp_path / "one")


def test_uint32_for_a_large_vocabulary_and_select(tmp_path: Path) -> None:
    write_corpus(tmp_path)
    prepare(config(tmp_path), tmp_path / "p", workers=1, show_progress=False, log=lambda _: None)
    manifest = json.loads((tmp_path / "p" / "manifest.json").read_text())
    manifest["dtype"] = "uint32"  # what prepare writes above 65,536 pieces: read the same way
    for name in ("src", "tgt"):
        data = np.fromfile(tmp_path / "p" / f"train.000.{name}.bin", dtype="<u2")
        data.astype("<u4").tofile(tmp_path / "p" / f"train.000.{name}.bin")
    wide = PreparedSplit(tmp_path / "p", "train", manifest)
    narrow_ids = np.fromfile(tmp_path / "p" / "train.000.src.bin", dtype="<u4")
    assert wide[0][0] == narrow_ids[: len(wide[0][0])].tolist()
    view = select_pairs(wide, np.array([5, 2]))
    assert isinstance(view, PreparedSplit) and len(view) == 2 and view[1] == wide[2]
    assert (length_index(view) == wide.model_lengths()[[5, 2]]).all()
    assert view[0:2] == [wide[5], wide[2]]


def test_ids_read_a_batch_at_a_time_equal_the_pairs(tmp_path: Path) -> None:
    """``ids_of`` (the Trainer's reader takes it) across shards, in any order, from a view."""
    write_corpus(tmp_path)
    prepare(
        config(tmp_path),
        tmp_path / "p",
        workers=1,
        shard_pairs=70,
        show_progress=False,
        log=lambda _: None,
    )
    train = PreparedSplit(tmp_path / "p", "train")
    assert len(train.manifest["splits"]["train"]["shards"]) >= 3
    rng = np.random.default_rng(0)
    for split in (train, select_pairs(train, rng.permutation(len(train))[:150])):
        rows = rng.integers(0, len(split), 60)  # shards mixed, repeats allowed
        for k, side in enumerate(("src", "tgt")):
            ids, lens = split.ids_of(rows, side)
            want = [split[int(i)][k] for i in rows]
            assert lens.tolist() == [len(w) for w in want]
            assert ids.dtype == np.int64 and ids.tolist() == [x for w in want for x in w]


def test_a_length_table_of_another_shape_is_named(tmp_path: Path) -> None:
    write_corpus(tmp_path)
    prepare(config(tmp_path), tmp_path / "p", workers=1, show_progress=False, log=lambda _: None)
    table = tmp_path / "p" / "train.lengths.npy"
    n = len(np.load(table))
    for bad in (np.array(7, dtype=np.uint32), np.zeros((n, 3), dtype=np.uint32)):
        np.save(table, bad)
        said = re.escape(f"a table of shape {bad.shape}, the manifest says {n} pairs")
        with pytest.raises(UserError, match=said):
            PreparedSplit(tmp_path / "p", "train")


def test_batches_from_an_array_equal_those_from_a_list() -> None:
    rng = random.Random(3)
    lengths = [(rng.randint(2, 40), rng.randint(2, 40)) for _ in range(500)]
    as_array = np.array(lengths, dtype=np.int32)
    assert token_batches(as_array, 200, seed=1, epoch=3) == token_batches(
        lengths, 200, seed=1, epoch=3
    )


def test_opening_checks_the_folder(tmp_path: Path) -> None:
    write_corpus(tmp_path)
    cfg = config(tmp_path)
    prepare(cfg, tmp_path / "p", workers=1, show_progress=False, log=lambda _: None)
    with pytest.raises(UserError, match="exists and is not an empty folder"):
        prepare(cfg, tmp_path / "p", workers=1, show_progress=False, log=lambda _: None)
    with pytest.raises(UserError, match="not a prepared dataset"):
        read_manifest(tmp_path)
    broken = tmp_path / "broken"
    shutil.copytree(tmp_path / "p", broken)
    with open(broken / "train.000.tgt.bin", "ab") as f:
        f.write(b"\0\0")
    with pytest.raises(UserError, match="train.000.tgt.bin: .* bytes, the index says"):
        PreparedSplit(broken, "train")
    (broken / "vocab.model").write_bytes((broken / "vocab.model").read_bytes() + b"x")
    with pytest.raises(UserError, match="vocabulary hash differs"):
        read_manifest(broken)


def _losses(run: Path) -> list[float]:
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if "loss" in r and r.get("split") != "valid"]


def test_train_and_resume_from_a_prepared_folder(tmp_path: Path) -> None:
    write_corpus(tmp_path)
    (tmp_path / "run.yaml").write_text(CONFIG.replace("DIR", str(tmp_path)))
    base = ["--config", str(tmp_path / "run.yaml")]
    assert (
        main(
            [
                "prepare",
                *base,
                "--out",
                str(tmp_path / "p"),
                "--workers",
                "1",
                "--quiet",
                "--set",
                "clean_dedup=true",
            ]
        )
        == 0
    )
    # the folder's data, not the files (moved away), with what it was prepared with (dedup)
    prepared = ["--set", f"prepared={tmp_path / 'p'}", "--set", "clean_dedup=true"]
    (tmp_path / "train.src").rename(tmp_path / "train.src.away")
    assert main(["train", *base, "--out", str(tmp_path / "full"), "--quiet", *prepared]) == 0
    (tmp_path / "train.src.away").rename(tmp_path / "train.src")
    assert (tmp_path / "full" / "vocab.model").read_bytes() == (
        tmp_path / "p" / "vocab.model"
    ).read_bytes()
    cut = tmp_path / "cut"
    shutil.copytree(tmp_path / "full", cut)
    for name in ("step_00000006.pt",):
        (cut / "checkpoints" / name).unlink()
    assert main(["train", *base, "--out", str(cut), "--quiet", "--resume", *prepared]) == 0
    assert _losses(cut) == pytest.approx(_losses(tmp_path / "full"), rel=1e-6)
    # Another prepared folder does not continue this run.
    assert main(["prepare", *base, "--out", str(tmp_path / "q"), "--workers", "1", "--quiet"]) == 0
    other = ["--set", f"prepared={tmp_path / 'q'}"]
    assert main(["train", *base, "--out", str(cut), "--quiet", "--resume", *other]) == 2


def test_damaged_ids_or_validation_text_are_refused_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # both failed mid-run: an id past the vocabulary in the embedding (a traceback), validation
    # text of another length at the first BLEU (after the steps before it)
    write_corpus(tmp_path)
    (tmp_path / "run.yaml").write_text(CONFIG.replace("DIR", str(tmp_path)))
    base = ["--config", str(tmp_path / "run.yaml")]
    assert main(["prepare", *base, "--out", str(tmp_path / "p"), "--workers", "1", "--quiet"]) == 0
    for name, damage in (
        (
            "ids",
            lambda f: (f / "train.000.src.bin").write_bytes(
                b"\xff" * 8 + (f / "train.000.src.bin").read_bytes()[8:]
            ),
        ),
        ("text", lambda f: (f / "valid.tgt.txt").write_text("one line\n", encoding="utf-8")),
    ):
        folder = tmp_path / name
        shutil.copytree(tmp_path / "p", folder)
        damage(folder)
        argv = ["train", *base, "--out", str(tmp_path / f"run_{name}"), "--quiet"]
        capsys.readouterr()
        assert main([*argv, "--set", f"prepared={folder}"]) == 2
        err = capsys.readouterr().err
        bad = "train.000.src.bin: holds id" if name == "ids" else "valid.tgt.txt: 1 lines"
        assert bad in err and "Traceback" not in err, err
        assert not (tmp_path / f"run_{name}" / "checkpoints").exists()


@pytest.mark.parametrize(
    "key,value",
    [
        ("vocab_size", "1000"),
        ("clean_max_len", "5"),
        ("clean_dedup", "true"),
        ("clean_ratio", "2"),
        ("vocab_sample", "500"),
        ("train_src", "/nowhere"),
    ],
)
def test_a_prepared_folder_refuses_data_keys_it_was_not_prepared_with(
    tmp_path: Path, capsys, key: str, value: str
) -> None:
    """The folder's data would stand in for the key's, and the checkpoint would record the key
    as applied: refused in one line naming it, before anything is written."""
    write_corpus(tmp_path)
    (tmp_path / "run.yaml").write_text(CONFIG.replace("DIR", str(tmp_path)))
    base = ["--config", str(tmp_path / "run.yaml")]
    assert main(["prepare", *base, "--out", str(tmp_path / "p"), "--workers", "1", "--quiet"]) == 0
    capsys.readouterr()
    out = tmp_path / "run"
    code = main(
        [
            "train",
            *base,
            "--out",
            str(out),
            "--quiet",
            "--set",
            f"prepared={tmp_path / 'p'}",
            "--set",
            f"{key}={value}",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"the config says {key} " in err and f"leave {key} out" in err
    assert not (out / "checkpoints").exists() and not (out / "model.pt").exists()


def test_vocab_command_and_reuse(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_corpus(tmp_path)
    (tmp_path / "run.yaml").write_text(CONFIG.replace("DIR", str(tmp_path)))
    base = ["--config", str(tmp_path / "run.yaml")]
    assert main(["vocab", *base, "--out", str(tmp_path / "v"), "--set", "shared_vocab=false"]) == 0
    assert sorted(p.name for p in (tmp_path / "v").iterdir()) == [
        "vocab.src.model",
        "vocab.tgt.model",
    ]
    again = ["vocab", *base, "--out", str(tmp_path / "v"), "--set", "shared_vocab=false"]
    before = (tmp_path / "v" / "vocab.src.model").stat().st_mtime_ns
    assert main(again) == 2  # a vocabulary there already: kept, unless --force
    assert "add --force to replace it" in capsys.readouterr().err
    assert (tmp_path / "v" / "vocab.src.model").stat().st_mtime_ns == before
    assert main([*again, "--force"]) == 0
    reuse = ["--set", "shared_vocab=false", "--set", f"vocab_model={tmp_path / 'v'}"]
    assert (
        main(["prepare", *base, "--out", str(tmp_path / "p"), "--quiet", "--workers", "1", *reuse])
        == 0
    )
    for side in ("src", "tgt"):
        assert (tmp_path / "p" / f"vocab.{side}.model").read_bytes() == (
            tmp_path / "v" / f"vocab.{side}.model"
        ).read_bytes()
    assert (
        main(
            [
                "prepare",
                *base,
                "--out",
                str(tmp_path / "x"),
                "--set",
                f"vocab_model={tmp_path / 'v' / 'vocab.src.model'}",
                "--set",
                "shared_vocab=false",
            ]
        )
        == 2
    )
    # keys of learning a vocabulary, given with a reused one: refused, not ignored
    capsys.readouterr()
    learning = (("vocab_size", 999, "keeps its size"), ("vocab_sample", 700, "none is"))
    for key, value, said in learning:
        out = tmp_path / f"with_{key}"
        argv = ["prepare", *base, "--out", str(out), "--quiet", *reuse, "--set", f"{key}={value}"]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and key in err and said in err, err


def test_a_gzip_damaged_inside_or_negative_workers_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Scanning the inputs met zlib's own error (a .gz whose deflate stream is damaged inside,
    not truncated) as a traceback; and --workers -3 ran with one process in silence."""
    import gzip

    from transduce.data.prepare import scan_input

    text = "".join(f"line {i} of a sentence with words\n" for i in range(3000)).encode()
    damaged = bytearray(gzip.compress(text))
    damaged[300:340] = bytes(b ^ 0xFF for b in damaged[300:340])
    path = tmp_path / "bad.en.gz"
    path.write_bytes(bytes(damaged))
    with pytest.raises(UserError, match="bad.en.gz: corrupt gzip file"):
        scan_input(path)
    folder = tmp_path / "corpus"
    write_corpus(folder, n=50)
    with pytest.raises(UserError, match="workers must be 0"):
        prepare(config(folder), tmp_path / "out", workers=-3)
    (tmp_path / "run.yaml").write_text(CONFIG.replace("DIR", str(folder)))
    base = ["prepare", "--config", str(tmp_path / "run.yaml"), "--out", str(tmp_path / "o")]
    for flag, value in (("--workers", "-1"), ("--shard-pairs", "0")):  # named as typed
        assert main([*base, flag, value]) == 2
        assert f"error: {flag} must be" in capsys.readouterr().err


def test_a_misnamed_gzip_or_a_file_of_bare_carriage_returns_is_named_as_reading_names_it(
    tmp_path: Path,
) -> None:
    # the line count ran first and called either "parallel files differ in length"
    import gzip

    from transduce.data.prepare import scan_input

    packed = tmp_path / "packed.en"
    packed.write_bytes(gzip.compress(b"a line\nanother\n"))
    with pytest.raises(UserError, match="packed.en: gzip data in a file not named .gz"):
        scan_input(packed)
    mac = tmp_path / "mac.en"
    mac.write_bytes(b"one line\rtwo lines\rthree\r")
    with pytest.raises(UserError, match=r"mac.en: line 1: carriage return"):
        scan_input(mac)


def test_a_validation_split_of_no_pairs_is_refused(tmp_path: Path) -> None:
    """Validation files whose every pair has an empty side were prepared into an empty split,
    and training from that folder died at its first validation, steps after its last save."""
    folder = tmp_path / "corpus"
    write_corpus(folder, n=50)
    (folder / "valid.src").write_text("a dog\n\n\n")
    (folder / "valid.tgt").write_text("\nA CAT\n\n")
    with pytest.raises(UserError, match=r"valid.src and .*valid.tgt: no sentence pairs left with"):
        prepare(config(folder), tmp_path / "out", workers=1, log=lambda line: None)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def _edited(folder: Path, edit) -> None:  # noqa: ANN001
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    "damage,said",
    [
        (lambda m: m.pop("vocab"), "no vocab section"),
        (lambda m: m.update(dtype="float99"), "dtype 'float99'"),
        (lambda m: m["splits"]["train"].pop("shards"), "split 'train' has no shards"),
        (
            lambda m: m["splits"]["train"]["shards"][0].update(pairs="many"),
            "split 'train', shard 0",
        ),
    ],
)
def test_a_damaged_manifest_is_named_not_a_traceback(tmp_path: Path, damage, said) -> None:  # noqa: ANN001
    folder = tmp_path / "corpus"
    write_corpus(folder, n=50)
    prepare(config(folder), tmp_path / "p", workers=1, log=lambda line: None)
    _edited(tmp_path / "p", damage)
    with pytest.raises(UserError, match=rf"manifest.json: damaged manifest \({re.escape(said)}"):
        PreparedSplit(tmp_path / "p", "train")


def test_a_changed_index_or_pair_count_is_refused(tmp_path: Path) -> None:
    """An edited idx.npy moved pairs' bounds in silence (pairs read as others' ids, one empty);
    a manifest's pair count that disagreed with the index was said in bytes that agreed."""
    folder = tmp_path / "corpus"
    write_corpus(folder, n=50)
    prepare(config(folder), tmp_path / "p", workers=1, log=lambda line: None)
    shutil.copytree(tmp_path / "p", tmp_path / "q")
    index = np.load(tmp_path / "p" / "train.000.idx.npy")
    index[5] = index[7]
    np.save(tmp_path / "p" / "train.000.idx.npy", index)
    with pytest.raises(UserError, match="train.000.idx.npy: its pairs' bounds disagree with"):
        PreparedSplit(tmp_path / "p", "train")
    _edited(tmp_path / "q", lambda m: m["splits"]["train"]["shards"][0].update(pairs=10))
    with pytest.raises(UserError, match=r"train.000.idx.npy: \d+ pairs, the manifest says 10;"):
        PreparedSplit(tmp_path / "q", "train")


@pytest.mark.parametrize(
    "command,key",
    [
        ("prepare", "d_model=64"),
        ("prepare", "bpe_dropout=0.1"),
        ("prepare", "max_valid_sentences=3"),
        ("vocab", "clean_dedup=true"),
        ("vocab", "valid_src=x"),
        ("vocab", "beam=2"),
    ],
)
def test_a_set_the_data_commands_do_not_read_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, key: str
) -> None:
    write_corpus(tmp_path, n=50)
    (tmp_path / "run.yaml").write_text(CONFIG.replace("DIR", str(tmp_path)))
    argv = [command, "--config", str(tmp_path / "run.yaml"), "--out", str(tmp_path / "o")]
    assert main([*argv, "--set", key]) == 2
    err = capsys.readouterr().err
    assert f"--set {key.split('=')[0]}: {command} reads only the task's files" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", ["prepare", "vocab"])
def test_a_training_file_of_empty_lines_is_refused_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """vocab learned on the other side alone; prepare said "no non-empty sentences", no file."""
    write_corpus(tmp_path, n=50)
    (tmp_path / "train.src").write_text("\n" * 76 + "  \n")  # as many lines as train.tgt
    (tmp_path / "run.yaml").write_text(CONFIG.replace("DIR", str(tmp_path)))
    argv = [command, "--config", str(tmp_path / "run.yaml"), "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'train.src'} (task.train_src): all 77 lines are empty" in err, err


def test_vocab_reads_the_training_files_alone(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    """vocab learns on the training text; a config whose validation files are elsewhere (not
    there on this machine) was refused for them."""
    write_corpus(tmp_path, n=50)
    (tmp_path / "valid.src").unlink()
    (tmp_path / "run.yaml").write_text(CONFIG.replace("DIR", str(tmp_path)))
    argv = ["vocab", "--config", str(tmp_path / "run.yaml"), "--out", str(tmp_path / "v")]
    assert main(argv) == 0, capsys.readouterr().err
    assert (tmp_path / "v" / "vocab.model").is_file()
    (tmp_path / "train.src").unlink()  # a bad input: refused before the folder is made
    assert main([*argv[:-1], str(tmp_path / "w")]) == 2
    assert "train_src" in capsys.readouterr().err and not (tmp_path / "w").exists()


def test_a_carriage_return_in_a_kept_validation_line_trains_from_the_folder_as_from_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Line 2 of valid.src holds a \\r (accepted there: only a line 1 \\r means Mac line ends);
    line 1 is dropped (empty), so the \\r line became line 1 of valid.src.txt, and training from
    the folder refused the file prepare wrote (exit 2)."""
    from transduce.data.parallel import read_lines, read_parallel

    write_corpus(tmp_path, n=50)
    (tmp_path / "valid.src").write_bytes(b"\nfoo\rbar dog\nthe cat\n")
    (tmp_path / "valid.tgt").write_bytes(b"X\nFOO BAR\nTHE CAT\n")
    folder = tmp_path / "p"
    prepare(config(tmp_path), folder, workers=1, log=lambda line: None)
    files = read_parallel(tmp_path / "valid.src", tmp_path / "valid.tgt")
    assert (
        read_lines(folder / "valid.src.txt", written=True)
        == files.source
        == [
            "foo\rbar dog",
            "the cat",
        ]
    )
    capsys.readouterr()
    base = ["--config", str(tmp_path / "run.yaml"), "--quiet", "--set", f"prepared={folder}"]
    assert main(["train", *base, "--out", str(tmp_path / "run")]) == 0, capsys.readouterr().err


def test_another_file_of_the_same_size_is_not_taken_for_the_prepared_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """train_src naming another file of the same byte size was taken for the file the folder
    was prepared from: its data silently replaced by the folder's."""
    from transduce.training.tasks.translation_prepared import _open

    write_corpus(tmp_path, n=50)
    folder = tmp_path / "p"
    prepare(config(tmp_path), folder, workers=1, log=lambda line: None)
    text = (tmp_path / "train.src").read_bytes()
    (tmp_path / "copy.src").write_bytes(text)  # the folder moved with a copy: still accepted
    cfg = config(tmp_path, prepared=str(folder), train_src=str(tmp_path / "copy.src"))
    assert _open(cfg.task)[0] == folder  # type: ignore[arg-type]
    (tmp_path / "other.src").write_bytes(text.replace(b"the", b"eht"))
    assert len(text) == (tmp_path / "other.src").stat().st_size
    capsys.readouterr()
    base = ["--config", str(tmp_path / "run.yaml"), "--quiet", "--set", f"prepared={folder}"]
    argv = ["train", *base, "--set", f"train_src={tmp_path / 'other.src'}"]
    assert main([*argv, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "the config says train_src " in err, err
    assert "other.src" in err and not (tmp_path / "run" / "checkpoints").exists()


def test_the_prepared_file_edited_in_place_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """train_src at the very path the folder was prepared from, edited since (another size, or
    the same size and other bytes): the folder's old data silently stood in for it. Untouched,
    touched with the same bytes, or removed, the folder is still taken."""
    import os

    from transduce.training.tasks.translation_prepared import _open

    write_corpus(tmp_path, n=50)
    folder = tmp_path / "p"
    prepare(config(tmp_path), folder, workers=1, log=lambda line: None)
    src = tmp_path / "train.src"
    text = src.read_bytes()
    cfg = config(tmp_path, prepared=str(folder))
    assert _open(cfg.task)[0] == folder  # type: ignore[arg-type]
    os.utime(src, ns=(1, 1))  # touched, the same bytes: hashed and accepted
    assert _open(cfg.task)[0] == folder  # type: ignore[arg-type]
    base = ["--config", str(tmp_path / "run.yaml"), "--quiet", "--set", f"prepared={folder}"]
    for edited in (text.replace(b"the", b"eht"), text + b"one more line\n"):
        src.write_bytes(edited)
        capsys.readouterr()
        assert main(["train", *base, "--out", str(tmp_path / "run")]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and "which has changed since" in err, err
        assert "train.src" in err and not (tmp_path / "run" / "checkpoints").exists()
    src.unlink()  # the raw text removed after preparing: the folder holds the data
    assert _open(cfg.task)[0] == folder  # type: ignore[arg-type]


def test_negative_or_past_the_end_pair_numbers_are_refused(tmp_path: Path) -> None:
    """numpy wrapped -1 to the last pair, in ``ids_of`` and ``select``, of a split or a view."""
    write_corpus(tmp_path, n=50)
    prepare(config(tmp_path), tmp_path / "p", workers=1, log=lambda line: None)
    train = PreparedSplit(tmp_path / "p", "train")
    view = train.select(np.array([4, 1, 2]))
    assert view.ids_of(np.array([2, 0]), "tgt")[1].tolist() == [len(train[2][1]), len(train[4][1])]
    for split in (train, view):
        for bad in (np.array([0, -1]), np.array([len(split)])):
            with pytest.raises(IndexError, match="pair numbers must lie in 0 .. "):
                split.ids_of(bad, "src")
            with pytest.raises(IndexError, match="pair numbers must lie in 0 .. "):
                split.select(bad)
    assert len(view.select(np.array([], dtype=np.int64))) == 0


def test_training_from_the_files_cleans_as_prepare_does(tmp_path: Path) -> None:
    """The task.clean_* keys act on a run trained from the files: with prepare's vocabulary, its
    training pairs are the prepared folder's, pair for pair, and each filter removed as many."""
    from transduce.training.distributed import World
    from transduce.training.tasks.translation_files import from_files

    m = _prepared_clean(tmp_path)
    lines: list[str] = []
    cfg = config(tmp_path, **CLEAN, vocab_model=str(tmp_path / "p"))
    data = from_files(
        cfg, tmp_path / "run", World(), resume=False, log=lines.append, validator=lambda *a: None
    )
    prepared = PreparedSplit(tmp_path / "p", "train")
    assert [tuple(p) for p in data.train_pairs] == [tuple(p) for p in prepared]
    removed = dict(m["splits"]["train"]["removed"])
    assert data.counts["train_skipped_empty"] == removed.pop("empty") == 3
    assert data.counts["train_removed"] == {k: n for k, n in removed.items() if n}
    assert data.counts["train_pairs"] == len(prepared)
    assert any("pairs kept by the task.clean_* filters" in line for line in lines)
    # without a filter, every pair read trains
    plain = from_files(
        config(tmp_path, vocab_model=str(tmp_path / "p")),
        tmp_path / "plain",
        World(),
        resume=False,
        log=lambda _: None,
        validator=lambda *a: None,
    )
    assert len(plain.train_pairs) == 617 - 3 and "train_removed" not in plain.counts


def test_cleaning_that_leaves_no_training_pair_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_corpus(tmp_path)
    (tmp_path / "run.yaml").write_text(CONFIG.replace("DIR", str(tmp_path)))
    cmd = ["train", "--config", str(tmp_path / "run.yaml"), "--out", str(tmp_path / "r")]
    assert main([*cmd, "--quiet", "--set", "clean_max_len=1"]) == 2
    assert "no sentence pairs left after the task.clean_* filters (614 too long removed)" in (
        capsys.readouterr().err
    )
    assert main([*cmd, "--quiet", "--set", "clean_max_len=30"]) == 0  # the folder taken again


def test_a_reused_vocabulary_is_checked_by_its_files_not_its_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """vocab_model was compared as text: the same file named another way was refused, and
    another file under the folder's name trained silently on the folder's vocabulary; and
    vocab_size equal to the reused size, which prepare takes, was refused."""
    write_corpus(tmp_path)
    (tmp_path / "run.yaml").write_text(CONFIG.replace("DIR", str(tmp_path)))
    base = ["--config", str(tmp_path / "run.yaml")]
    assert main(["vocab", *base, "--out", str(tmp_path / "v")]) == 0
    assert main(["vocab", *base, "--out", str(tmp_path / "w"), "--set", "vocab_size=50"]) == 0
    reuse = ["--set", f"vocab_model={tmp_path / 'v' / 'vocab.model'}"]
    assert main(["prepare", *base, "--out", str(tmp_path / "p"), "--workers", "1", *reuse]) == 0
    capsys.readouterr()
    train = [*base, "--quiet", "--set", f"prepared={tmp_path / 'p'}", "--set", "max_steps=1"]
    monkeypatch.chdir(tmp_path / "v")  # the same file, by a relative name

    def run(name: str, *sets: str) -> tuple[int, str]:
        argv = ["train", *train, "--out", str(tmp_path / name)]
        code = main([*argv, *(a for s in sets for a in ("--set", s))])
        return code, capsys.readouterr().err

    assert run("same", "vocab_model=vocab.model")[0] == 0
    assert run("size", f"vocab_model={tmp_path / 'v'}", "vocab_size=60")[0] == 0
    code, err = run("other", f"vocab_model={tmp_path / 'w' / 'vocab.model'}")
    assert code == 2 and "the config says vocab_model" in err, err
    code, err = run("wrong_size", "vocab_size=50")
    assert code == 2 and "prepared with vocab_size 60, the config says vocab_size 50" in err, err
