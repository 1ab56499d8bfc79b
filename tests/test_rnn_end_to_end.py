"""The recurrent baseline (model.architecture = rnn) through every tool the Transformer has:
training, resume, averaging, greedy and beam search, translate, evaluate, serve; export and
attention refuse it with one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from inference_testkit import save_toy_translation_model, toy_sentences

from transduce import checkpoint
from transduce.cli.main import main
from transduce.config import Config, update
from transduce.data.synthetic import make_task
from transduce.inference import beam_search, greedy_search
from transduce.inference.search import predict_ids
from transduce.inference.translator import Translator
from transduce.recurrent import RecurrentSeq2Seq
from transduce.training.run import train_synthetic

RNN_COPY = {
    "architecture": "rnn",
    "n_layers": 1,
    "d_model": 64,
    "dropout": 0.0,
    "label_smoothing": 0.0,
    "warmup": 50,
    "lr_factor": 1.0,
    "clip_norm": 1.0,
    "max_tokens": 512,
    "max_steps": 300,
    "eval_every": 100,
    "save_every": 50,
    "keep_last": 3,
    "log_every": 50,
    "tensorboard": False,
    "name": "copy",
    "train_size": 2000,
    "valid_size": 100,
    "max_length": 5,
    "n_symbols": 8,
    "beam": 1,
}


@pytest.fixture(scope="module")
def copy_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Config, dict]:
    cfg = update(Config(), RNN_COPY)
    run = tmp_path_factory.mktemp("rnn")
    return run, cfg, train_synthetic(cfg, run, show_progress=False)


def test_rnn_learns_copy_and_searches_run_on_it(copy_run) -> None:
    run, cfg, summary = copy_run
    assert summary["seq_accuracy"] >= 0.8, summary
    model, vocab, _ = checkpoint.load_model(run / "model.pt")
    assert isinstance(model, RecurrentSeq2Seq)
    task = make_task(cfg.task)
    sources = [vocab.encode(s) for s, _ in task.valid[:50]]
    hyps = predict_ids(model, sources, batch_size=16, max_len_offset=5)
    assert sum(vocab.decode(h) == t for h, (_, t) in zip(hyps, task.valid)) >= 40
    src = torch.nn.utils.rnn.pad_sequence([torch.tensor([*s, 2]) for s in sources], True)
    beams = beam_search(model, src, beam=1, max_len_offset=5)
    assert [b[0].tokens for b in beams] == greedy_search(model, src, max_len_offset=5)


def test_rnn_run_resumes_exactly_and_averages(copy_run, tmp_path: Path) -> None:
    _, cfg, _ = copy_run
    short = update(cfg, {"max_steps": 60, "eval_every": 30, "save_every": 30})
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train_synthetic(short, straight, show_progress=False)
    train_synthetic(update(short, {"max_steps": 30}), resumed, show_progress=False)
    train_synthetic(short, resumed, resume=True, show_progress=False)
    a = checkpoint.load(straight / "model.pt")["model"]
    b = checkpoint.load(resumed / "model.pt")["model"]
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)
    out = tmp_path / "avg.pt"
    assert (
        main(
            [
                "--no-malloc-tuning",
                "average",
                "--run",
                str(straight),
                "--last",
                "2",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    averaged, _, avg_cfg = checkpoint.load_model(out)
    assert isinstance(averaged, RecurrentSeq2Seq) and avg_cfg == short
    # the element-wise mean of the last two checkpoints (steps 30 and 60), exactly
    last_two = checkpoint.step_checkpoints(straight / "checkpoints")[-2:]
    assert [p.name for p in last_two] == ["step_00000030.pt", "step_00000060.pt"]
    first, second = (checkpoint.load(p)["model"] for p in last_two)
    state = averaged.state_dict()
    assert state.keys() == first.keys() and any(not torch.equal(first[k], second[k]) for k in first)
    for key, value in state.items():
        mean = (first[key].double() + second[key].double()) / 2
        assert torch.equal(value, mean.to(value.dtype)), key


@pytest.fixture(scope="module")
def rnn_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rnn_toy") / "model.pt"
    return save_toy_translation_model(
        path, {"beam": 3, "max_len_offset": 4}, model={"architecture": "rnn"}
    )


def test_translate_evaluate_and_serve_an_rnn(rnn_file: Path, tmp_path: Path, capsys) -> None:
    from transduce.serve.server import ServerThread, create_app

    lines = toy_sentences(6, seed=3)
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    code = main(
        [
            "--no-malloc-tuning",
            "translate",
            "--model",
            str(rnn_file),
            "--input",
            str(tmp_path / "in.txt"),
            "--output",
            str(tmp_path / "out.txt"),
            "--quiet",
        ]
    )
    assert code == 0, capsys.readouterr().err
    translator = Translator.load(rnn_file)
    out = (tmp_path / "out.txt").read_text().splitlines()
    assert out == translator.translate(lines)
    code = main(
        [
            "--no-malloc-tuning",
            "evaluate",
            "--model",
            str(rnn_file),
            "--src",
            str(tmp_path / "in.txt"),
            "--ref",
            str(tmp_path / "in.txt"),
            "--quiet",
        ]
    )
    assert code == 0 and "bleu" in json.loads(capsys.readouterr().out)
    import urllib.request

    with ServerThread(create_app(translator)) as srv:
        body = json.dumps({"text": lines}).encode()
        req = urllib.request.Request(
            srv.url + "/translate", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            assert json.loads(resp.read())["translations"] == out


@pytest.mark.parametrize("command", ["export", "attention"])
def test_export_and_attention_refuse_an_rnn(
    rnn_file: Path, tmp_path: Path, capsys, command
) -> None:
    if command == "export":
        argv = ["export", "ctranslate2", "--model", str(rnn_file), "--output", str(tmp_path / "ct")]
    else:
        argv = [
            "attention",
            "--model",
            str(rnn_file),
            "--src",
            "a b",
            "--output",
            str(tmp_path / "a.png"),
        ]
    assert main(["--no-malloc-tuning", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ("rnn" in err[0] or "Transformer" in err[0])


def test_rnn_trains_in_bf16_weights_as_under_autocast(tmp_path: Path) -> None:
    """precision bf16-weights with the LSTMs: the bfloat16 copy trains (its flat LSTM weights
    are the copy's own) as autocast does, and the checkpoint holds the float32 model. Both
    learn the task: compared at its end, not midway down the steep part of the loss curve,
    where the two bfloat16 trajectories part by up to 0.5 (on an Intel AMX CPU)."""
    for precision in ("bf16", "bf16-weights"):
        cfg = update(Config(), {**RNN_COPY, "max_steps": 200, "eval_every": 0, "log_every": 10})
        summary = train_synthetic(update(cfg, {"precision": precision}), tmp_path / precision)
        lines = (tmp_path / precision / "metrics.jsonl").read_text().splitlines()
        losses = [r["loss"] for r in map(json.loads, lines) if "loss" in r and "split" not in r]
        assert summary["step"] == 200 and losses[-1] < 0.5 < 2 < losses[0], (precision, losses)
        assert summary["seq_accuracy"] >= 0.8, (precision, summary)
    saved = torch.load(tmp_path / "bf16-weights" / "model.pt", weights_only=False)["model"]
    assert {v.dtype for v in saved.values() if v.is_floating_point()} == {torch.float32}
