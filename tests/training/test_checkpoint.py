"""Checkpoints: atomic writes, clear load errors, step files, pruning, averaging, load_model."""

import errno
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from transduce import checkpoint
from transduce.config import Config, update
from transduce.data.vocab import CharVocab
from transduce.errors import UserError
from transduce.model.transformer import make_model

TINY = {"n_layers": 1, "d_model": 16, "d_ff": 32, "n_heads": 2, "d_k": 8, "d_v": 8, "dropout": 0.0}


def _cfg() -> Config:
    return update(Config(), TINY)


def _ckpt(seed: int, **extra) -> dict:
    torch.manual_seed(seed)
    vocab = CharVocab(list("abcde"))
    model = make_model(_cfg().model, src_vocab_size=len(vocab))
    return {
        "config": _cfg().to_dict(),
        "vocab": vocab.to_dict(),
        "model": model.state_dict(),
        **extra,
    }


def test_save_atomic_writes_and_leaves_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "x.pt"
    checkpoint.save_atomic({"a": torch.arange(3)}, path)
    checkpoint.save_atomic({"a": torch.arange(4)}, path)
    assert sorted(p.name for p in path.parent.iterdir()) == ["x.pt"]
    assert torch.equal(torch.load(path)["a"], torch.arange(4))


def test_text_written_atomically_is_never_seen_empty(tmp_path: Path) -> None:
    """A rank reading prepared.json or config.json while rank 0 rewrites it (a resume) sees the
    old text or the new, never an empty file: with Path.write_text (truncate, then write) a
    reader thread saw "" within a few hundred rewrites here (the JSONDecodeError of a 2-rank
    resume in CI)."""
    import threading

    path = tmp_path / "prepared.json"
    checkpoint.write_text_atomic(path, '{"a": 1}\n')
    seen: set[str] = set()
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            seen.add(path.read_text(encoding="utf-8"))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(2000):
            checkpoint.write_text_atomic(path, f'{{"a": {i % 2}}}\n')
    finally:
        done.set()
        reader.join()
    assert seen <= {'{"a": 0}\n', '{"a": 1}\n'} and seen
    assert [p.name for p in tmp_path.iterdir()] == ["prepared.json"]  # no temporary file left


def test_failed_save_keeps_old_file_and_removes_temp(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "model.pt"
    checkpoint.save_atomic({"v": torch.ones(2)}, path)
    before = path.read_bytes()
    real_save = torch.save

    def broken_save(obj, f, *args, **kwargs):  # writes part of a file, then fails
        real_save({"v": torch.zeros(1000)}, f, *args, **kwargs)
        f.flush()
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.save_atomic({"v": torch.zeros(2)}, path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]

    def interrupted(obj, f, *args, **kwargs):
        f.write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_atomic({"v": torch.zeros(2)}, path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not found"):
        checkpoint.load(tmp_path / "missing.pt")
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"\x00not a checkpoint at all" * 10)
    with pytest.raises(UserError, match="garbage.pt"):
        checkpoint.load(garbage)
    no_model = tmp_path / "no_model.pt"
    torch.save({"config": {}, "weights": {}}, no_model)
    with pytest.raises(UserError, match="no_model.pt"):
        checkpoint.load(no_model)
    a_list = tmp_path / "list.pt"
    torch.save([1, 2, 3], a_list)
    with pytest.raises(UserError, match="list.pt"):
        checkpoint.load(a_list)
    with pytest.raises(UserError, match="not found"):
        checkpoint.load(tmp_path)  # a folder without model.pt


def test_load_run_folder_reads_model_pt(tmp_path: Path) -> None:
    checkpoint.save(_ckpt(0), tmp_path / "model.pt")
    data = checkpoint.load(tmp_path)
    assert set(data) >= {"config", "vocab", "model"}


def test_step_checkpoints_numeric_order(tmp_path: Path) -> None:
    assert checkpoint.step_checkpoints(tmp_path / "nowhere") == []
    for step in (10, 9, 100, 1):
        checkpoint.step_path(tmp_path, step).write_bytes(b"")
    (tmp_path / "step_5.pt").write_bytes(b"")  # unpadded names still compare numerically
    (tmp_path / "step_00000007.pt.tmp").write_bytes(b"")
    (tmp_path / ".step_00000011.pt.abc.tmp").write_bytes(b"")
    (tmp_path / "model.pt").write_bytes(b"")
    names = [p.name for p in checkpoint.step_checkpoints(tmp_path)]
    assert names == [
        "step_00000001.pt",
        "step_5.pt",
        "step_00000009.pt",
        "step_00000010.pt",
        "step_00000100.pt",
    ]
    assert checkpoint.step_path(tmp_path, 10).name == "step_00000010.pt"


def test_prune_keeps_last(tmp_path: Path) -> None:
    for step in range(1, 13):
        checkpoint.step_path(tmp_path, step).write_bytes(b"")
    (tmp_path / "best.pt").write_bytes(b"")
    checkpoint.prune(tmp_path, 3)
    assert [p.name for p in checkpoint.step_checkpoints(tmp_path)] == [
        "step_00000010.pt",
        "step_00000011.pt",
        "step_00000012.pt",
    ]
    assert (tmp_path / "best.pt").exists()
    checkpoint.prune(tmp_path, 5)  # fewer than K: nothing goes
    assert len(checkpoint.step_checkpoints(tmp_path)) == 3
    checkpoint.prune(tmp_path, 0)
    assert checkpoint.step_checkpoints(tmp_path) == []


def test_prune_drops_checkpoints_off_the_schedule_unless_newest(tmp_path: Path) -> None:
    for step in (4, 7, 8, 12, 13):  # save_every 4; 7 and 13 written for a stop signal
        checkpoint.step_path(tmp_path, step).write_bytes(b"")
    checkpoint.prune(tmp_path, 3, save_every=4)
    assert [p.name for p in checkpoint.step_checkpoints(tmp_path)] == [
        "step_00000008.pt",
        "step_00000012.pt",
        "step_00000013.pt",
    ]
    checkpoint.step_path(tmp_path, 16).write_bytes(b"")
    checkpoint.prune(tmp_path, 3, save_every=4)
    assert [p.name for p in checkpoint.step_checkpoints(tmp_path)] == [
        "step_00000008.pt",
        "step_00000012.pt",
        "step_00000016.pt",
    ]


def test_average_is_mean_of_state_dicts(tmp_path: Path) -> None:
    ckpts = []
    for seed in range(3):
        c = _ckpt(seed)
        c["model"]["counter"] = torch.tensor([seed, 10 * seed], dtype=torch.long)  # an int buffer
        c["model"]["half"] = torch.randn(4).to(torch.bfloat16)
        c["vocab"] = {"kind": "char", "symbols": "abcde"}
        ckpts.append(c)
    paths = []
    for i, c in enumerate(ckpts):
        paths.append(tmp_path / f"c{i}.pt")
        checkpoint.save(c, paths[-1])
    out = checkpoint.average(paths)
    assert set(out["model"]) == set(ckpts[0]["model"])
    for k, v in out["model"].items():
        if k == "counter":
            assert v.dtype == torch.long and v.tolist() == [2, 20]  # the newest one's, not a mean
            continue
        expected = sum(c["model"][k].double() for c in ckpts) / 3
        assert v.dtype == ckpts[0]["model"][k].dtype
        torch.testing.assert_close(v, expected.to(v.dtype), rtol=0, atol=0)
    assert out["vocab"] == ckpts[-1]["vocab"]
    assert out["config"] == ckpts[-1]["config"]
    assert out["averaged"] == [str(p) for p in paths]


def test_average_result_loads_as_model(tmp_path: Path) -> None:
    paths = []
    for seed in range(2):
        paths.append(tmp_path / f"c{seed}.pt")
        checkpoint.save(_ckpt(seed, optimizer={"state": {}}, step=seed), paths[-1])
    out = checkpoint.average(paths)
    assert "optimizer" not in out and "step" not in out
    checkpoint.save(out, tmp_path / "avg.pt")
    model, _, cfg = checkpoint.load_model(tmp_path / "avg.pt")
    assert cfg == _cfg()
    expected = (
        _ckpt(0)["model"]["decoder.embed.weight"] + _ckpt(1)["model"]["decoder.embed.weight"]
    ) / 2
    torch.testing.assert_close(model.state_dict()["decoder.embed.weight"], expected)


def test_average_of_one_is_identity(tmp_path: Path) -> None:
    c = _ckpt(4)
    checkpoint.save(c, tmp_path / "a.pt")
    out = checkpoint.average([tmp_path / "a.pt"])
    for k, v in c["model"].items():
        assert torch.equal(out["model"][k], v)


def test_average_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError):
        checkpoint.average([])
    a, b = _ckpt(0), _ckpt(1)
    b["model"]["extra"] = torch.zeros(1)
    checkpoint.save(a, tmp_path / "a.pt")
    checkpoint.save(b, tmp_path / "b.pt")
    with pytest.raises(UserError, match="b.pt"):
        checkpoint.average([tmp_path / "a.pt", tmp_path / "b.pt"])
    del b["model"]["extra"]
    b["model"]["encoder.embed.weight"] = torch.zeros(3, 3)  # same keys, another shape
    checkpoint.save(b, tmp_path / "b.pt")
    with pytest.raises(UserError, match="b.pt"):
        checkpoint.average([tmp_path / "a.pt", tmp_path / "b.pt"])
    with pytest.raises(UserError, match="not found"):
        checkpoint.average([tmp_path / "a.pt", tmp_path / "missing.pt"])


def test_average_refuses_models_of_other_vocabularies_or_configs(tmp_path: Path) -> None:
    # equal shapes, other models: averaging them would give nonsense in silence
    a, b = _ckpt(0), _ckpt(1)
    a["vocab"], b["vocab"] = (
        {"kind": "char", "symbols": s} for s in ("abcdefghijklmnop", "ponmlkjihgfedcba")
    )
    for name, c in (("a.pt", a), ("b.pt", b)):
        checkpoint.save(c, tmp_path / name)
    with pytest.raises(UserError, match="b.pt: its vocabulary is not that of"):
        checkpoint.average([tmp_path / "a.pt", tmp_path / "b.pt"])
    b["vocab"] = a["vocab"]
    b["config"] = {**b["config"], "model": {**b["config"]["model"], "norm": "pre"}}
    checkpoint.save(b, tmp_path / "b.pt")
    with pytest.raises(UserError, match=r"b.pt: its model config differs .*\(norm\)"):
        checkpoint.average([tmp_path / "a.pt", tmp_path / "b.pt"])
    b["config"] = {**b["config"], "train": {**b["config"]["train"], "max_steps": 7}}
    b["config"]["model"] = a["config"]["model"]
    checkpoint.save(b, tmp_path / "b.pt")  # training settings may differ (a resumed run)
    assert checkpoint.average([tmp_path / "a.pt", tmp_path / "b.pt"])["averaged"]


def test_load_model_round_trip(tmp_path: Path) -> None:
    cfg = update(Config(), {**TINY, "dropout": 0.3})
    vocab = CharVocab(list("abcdef"))
    torch.manual_seed(0)
    model = make_model(cfg.model, src_vocab_size=len(vocab)).eval()
    checkpoint.save(
        {"config": cfg.to_dict(), "vocab": vocab.to_dict(), "model": model.state_dict()},
        tmp_path / "model.pt",
    )
    for where in (tmp_path / "model.pt", tmp_path):
        loaded, loaded_vocab, loaded_cfg = checkpoint.load_model(where)
        assert not loaded.training
        assert loaded_cfg == cfg
        assert loaded_vocab.to_dict() == vocab.to_dict()
        src = torch.tensor([[4, 5, 6, 2], [7, 2, 0, 0]])
        tgt = torch.tensor([[1, 4, 5], [1, 7, 0]])
        with torch.no_grad():
            assert torch.equal(loaded(src, tgt), model(src, tgt))


def test_save_atomic_is_a_rename(tmp_path: Path, monkeypatch) -> None:
    seen = []
    real_replace = os.replace

    def spy(src, dst):
        seen.append((Path(src).parent, Path(src).name, Path(dst)))
        assert Path(dst).read_bytes() == b"old"  # old file untouched until the rename
        return real_replace(src, dst)

    path = tmp_path / "x.pt"
    path.write_bytes(b"old")
    monkeypatch.setattr(os, "replace", spy)
    checkpoint.save_atomic({"a": 1}, path)
    ((parent, name, dst),) = seen
    assert parent == tmp_path and name != "x.pt" and dst == path
    assert torch.load(path) == {"a": 1}


def test_a_full_disk_inside_torch_save_is_the_oserror(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that fails inside torch.save's C++ writer (the disk filling mid-file) reaches the
    caller as the OSError, not the RuntimeError torch makes of it; no file is left behind."""
    real_fdopen = os.fdopen

    class FillsUp:
        def __init__(self, f: Any) -> None:
            self.f, self.written = f, 0

        def write(self, data: bytes) -> int:
            self.written += len(data)
            if self.written > 4096:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return self.f.write(data)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.f, name)

        def __enter__(self) -> Any:
            return self

        def __exit__(self, *exc: object) -> None:
            self.f.close()

    monkeypatch.setattr(os, "fdopen", lambda fd, mode: FillsUp(real_fdopen(fd, mode)))
    with pytest.raises(OSError) as e:
        checkpoint.save({"model": {"w": torch.zeros(100_000)}}, tmp_path / "step_00000001.pt")
    assert e.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == []


def test_weights_with_nan_or_infinity_are_refused_in_one_line(tmp_path: Path, capsys) -> None:
    # load_model (every command's --model) and average refuse them, naming the file and tensors
    from transduce.cli.main import main

    good, bad = _ckpt(0), _ckpt(1)
    bad["model"] = dict(bad["model"])
    key = next(k for k, v in bad["model"].items() if v.is_floating_point())
    bad["model"][key] = bad["model"][key].clone().fill_(float("nan"))
    checkpoint.save(good, tmp_path / "good.pt")
    checkpoint.save(bad, tmp_path / "bad.pt")
    with pytest.raises(UserError, match=rf"bad.pt: weights hold NaN or infinity \({key}\)"):
        checkpoint.load_model(tmp_path / "bad.pt")
    with pytest.raises(UserError, match="bad.pt: weights hold NaN or infinity"):
        checkpoint.average([tmp_path / "good.pt", tmp_path / "bad.pt"])
    (tmp_path / "in.txt").write_text("abc\n")
    argv = ["translate", "--model", str(tmp_path / "bad.pt"), "--input", str(tmp_path / "in.txt")]
    assert main(["--no-malloc-tuning", *argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1 and "NaN or infinity" in err


def test_average_refuses_a_damaged_config_in_one_line(tmp_path: Path) -> None:
    a, b = _ckpt(0), _ckpt(1)
    b["config"] = 5
    checkpoint.save(a, tmp_path / "a.pt")
    checkpoint.save(b, tmp_path / "b.pt")
    with pytest.raises(UserError, match="b.pt"):
        checkpoint.average([tmp_path / "a.pt", tmp_path / "b.pt"])
