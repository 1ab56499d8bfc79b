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
    assert reversed_model.translate(sources) == as_is.translate(flipped)
    targets = ["357", "87", "3"]
    got = [p.log_prob for p in reversed_model.score(sources, targets)]
    assert got == [p.log_prob for p in as_is.score(flipped, targets)]
    assert got != [p.log_prob for p in as_is.score(sources, targets)]  # the order matters


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
