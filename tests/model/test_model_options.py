"""Model options beyond the paper, for models made elsewhere (Marian): the FFN's activation and
a bias on the pre-softmax projection. Their defaults are the paper's: the same parameters and
state-dict keys as before, so older model files load unchanged."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from transduce.config import ModelConfig, from_dict
from transduce.errors import UserError
from transduce.model.feed_forward import PositionwiseFeedForward
from transduce.model.transformer import make_model

SMALL = {"n_layers": 1, "d_model": 16, "d_ff": 32, "n_heads": 2, "d_k": 8, "d_v": 8}


@pytest.mark.parametrize(
    ("name", "fn"),
    [
        ("relu", F.relu),
        ("swish", lambda x: x * torch.sigmoid(x)),  # Marian's (OPUS-MT)
        ("gelu", lambda x: 0.5 * x * (1 + torch.erf(x / 2**0.5))),  # the erf form
    ],
)
def test_feed_forward_activation(name: str, fn) -> None:
    torch.manual_seed(0)
    ffn = PositionwiseFeedForward(d_model=8, d_ff=16, activation=name)
    x = torch.randn(2, 3, 8)
    torch.testing.assert_close(ffn(x), ffn.w_2(fn(ffn.w_1(x))))


def test_defaults_keep_the_paper_s_parameters() -> None:
    model = make_model(ModelConfig(**SMALL), src_vocab_size=11)
    assert "generator.bias" not in model.state_dict() and model.generator.bias is None
    biased = make_model(ModelConfig(**SMALL, output_bias=True), src_vocab_size=11).eval()
    assert set(biased.state_dict()) == set(model.state_dict()) | {"generator.bias"}
    with torch.no_grad():
        biased.generator.bias.normal_()
        src, tgt = torch.tensor([[4, 5, 2]]), torch.tensor([[1, 6]])
        hidden = biased.decoder(tgt, *biased.encode(src))
        torch.testing.assert_close(
            biased(src, tgt), hidden @ biased.generator.weight.T + biased.generator.bias
        )


def test_config_checks_the_new_keys() -> None:
    with pytest.raises(UserError, match="model.activation"):
        ModelConfig(activation="tanh")  # type: ignore[arg-type]
    with pytest.raises(UserError, match="model.output_bias"):
        from_dict({"model": {"output_bias": "maybe"}})
    cfg = from_dict({"model": {"activation": "swish", "output_bias": True}})
    assert (cfg.model.activation, cfg.model.output_bias) == ("swish", True)
