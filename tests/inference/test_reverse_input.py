"""A synthetic model trained with ``task.reverse_input`` read its training sources reversed:
every command decodes, scores and draws a source reversed for it as it was trained, so
``12+345`` is read as the reversed model learned it."""

from __future__ import annotations

from pathlib import Path

from inference_testkit import save_toy_synthetic

from transduce import checkpoint
from transduce.inference.translator import Translator


def _reversed_copy(plain: Path, path: Path) -> Path:
    state = checkpoint.load(plain)
    state["config"]["task"]["reverse_input"] = True
    checkpoint.save(state, path)
    return path


def test_a_reversed_model_reads_its_sources_reversed(tmp_path: Path) -> None:
    plain = save_toy_synthetic(tmp_path / "plain.pt", {"beam": 2})
    reversed_model = Translator.load(_reversed_copy(plain, tmp_path / "reversed.pt"))
    as_is = Translator.load(plain)
    sources = ["12+345", "7+80", "1+2"]
    flipped = [s[::-1] for s in sources]
    # an untrained model's text says little: its n-best scores say which way it read
    best = reversed_model.translate_nbest(sources, 2)
    assert best == as_is.translate_nbest(flipped, 2)
    assert [h.score for hyps in best for h in hyps] != [
        h.score for hyps in as_is.translate_nbest(sources, 2) for h in hyps
    ]
    targets = ["357", "87", "3"]
    got = [p.log_prob for p in reversed_model.score(sources, targets)]
    assert got == [p.log_prob for p in as_is.score(flipped, targets)]
    assert got != [p.log_prob for p in as_is.score(sources, targets)]  # the order matters
    # the server's attention and the attention command read it so too
    from transduce.cli.main import main
    from transduce.serve.work import attention

    assert attention(reversed_model, "12+345", "357") == attention(as_is, "543+21", "357")
    assert attention(reversed_model, "12+345", "357") != attention(as_is, "12+345", "357")
    pages = {}
    for name, model, source in (("r", tmp_path / "reversed.pt", "12+345"), ("p", plain, "543+21")):
        out = tmp_path / f"{name}.html"
        argv = ["attention", "--model", str(model), "--src", source, "--tgt", "357"]
        assert main(["--no-malloc-tuning", *argv, "--output", str(out)]) == 0
        pages[name] = out.read_text(encoding="utf-8")
    assert pages["r"] == pages["p"]


def test_an_ensemble_of_models_that_read_alike_only(tmp_path: Path) -> None:
    import pytest

    from transduce.errors import UserError

    plain = save_toy_synthetic(tmp_path / "plain.pt", {"beam": 2})
    flipped = _reversed_copy(plain, tmp_path / "reversed.pt")
    with pytest.raises(UserError, match=r"reversed.pt: its task \(addition, input reversed\)"):
        Translator.load_ensemble([plain, flipped])
    for bad in ([], str(plain)):  # none, or a path where a list is asked for
        with pytest.raises(UserError, match="a list of one or more checkpoints"):
            Translator.load_ensemble(bad)  # type: ignore[arg-type]
    assert Translator.load_ensemble([plain, plain]).translate(["1+2"])
