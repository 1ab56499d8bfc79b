"""``weights="fp16"`` (``--precision fp16``): decoding in float16 weights, for CUDA GPUs without
bfloat16. Refused in one line elsewhere (a CPU emulates float16: ``kernels.fp16_refusal``); the
engine's float16 path itself is checked on the CPU through the Translator's constructor, and on
a GPU when there is one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from inference_testkit import train_upper_casing, upper_casing_pairs

from transduce.checkpoint import load_model
from transduce.cli.main import main
from transduce.errors import UserError
from transduce.evaluation.bleu import corpus_scores
from transduce.inference.engine import DecodingModel
from transduce.inference.translator import Translator
from transduce.kernels import fp16_refusal

REFUSAL = "precision fp16: float16 decoding is for CUDA GPUs; a cpu emulates float16 products"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model.pt that has learned to upper-case, somewhat (about 10 s on one CPU thread)."""
    return train_upper_casing(tmp_path_factory.mktemp("fp16"), upper_casing_pairs(400, seed=0)[0])


def _agreement(trained: Path, fp16: Translator) -> tuple[float, float, float]:
    """Share of 200 held-out outputs that fp16 decodes as fp32 does (beam 4), and both BLEUs."""
    src, ref = upper_casing_pairs(200, seed=1)
    fp32 = Translator.load(trained)
    out32 = fp32.translate(src, fp32.decode_config(beam=4))
    out16 = fp16.translate(src, fp16.decode_config(beam=4))
    same = sum(a == b for a, b in zip(out32, out16, strict=True)) / len(src)
    return same, corpus_scores(out32, ref)["bleu"], corpus_scores(out16, ref)["bleu"]


def test_the_engine_decodes_float16_weights_as_float32(trained: Path) -> None:
    """The engine in float16 (on the CPU, built directly: slow, but the same code a GPU runs):
    float16 keeps 11 bits of mantissa, so outputs change only at near ties."""
    model, vocab, cfg = load_model(trained)
    fp16 = Translator(model.half(), vocab, cfg)
    assert isinstance(fp16.decoding, DecodingModel)
    assert next(fp16.model.parameters()).dtype == torch.float16
    same, bleu32, bleu16 = _agreement(trained, fp16)
    assert bleu32 > 15 and same >= 0.95 and abs(bleu16 - bleu32) < 1.0, (same, bleu32, bleu16)


def test_fp16_is_refused_off_cuda_in_one_line(trained: Path) -> None:
    assert fp16_refusal(torch.device("cuda", 0)) is None
    with pytest.raises(UserError, match=REFUSAL):
        Translator.load(trained, weights="fp16")
    model, vocab, cfg = load_model(trained)
    with pytest.raises(UserError, match=REFUSAL):
        Translator.of_model(model, vocab, cfg, "fp16")


def test_the_cli_refuses_fp16_on_a_cpu(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "in.txt").write_text("dog on street\n", encoding="utf-8")
    args = ["--model", str(trained), "--input", str(tmp_path / "in.txt"), "--precision", "fp16"]
    assert main(["translate", *args, "--output", str(tmp_path / "out.txt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and REFUSAL in err[0], err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fp16_on_a_gpu_translates_as_fp32_on_the_cpu(trained: Path) -> None:
    same, bleu32, bleu16 = _agreement(trained, Translator.load(trained, "cuda", "fp16"))
    assert same >= 0.95 and abs(bleu16 - bleu32) < 1.0, (same, bleu32, bleu16)
