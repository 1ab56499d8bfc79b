"""Checkpoints written before the house was rebuilt (2026-11-25) still load: their config holds
every task's keys (one TaskConfig then) and their state-dict keys are the model's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from transduce import checkpoint
from transduce.cli.main import main
from transduce.config import SyntheticTaskConfig
from transduce.errors import UserError

# Config.to_dict() of a copy-task run as the code before the change wrote it
OLD_CONFIG = {
    "model": {
        "n_layers": 1,
        "d_model": 16,
        "d_ff": 32,
        "n_heads": 2,
        "d_k": 8,
        "d_v": 8,
        "dropout": 0.1,
        "attention_dropout": 0.0,
        "activation_dropout": 0.0,
        "positional": "sinusoidal",
        "max_positions": 1024,
        "norm": "post",
        "tie_embeddings": True,
    },
    "train": {
        "label_smoothing": 0.1,
        "warmup": 4000,
        "lr_factor": 1.0,
        "cooldown": 0.0,
        "adam_beta1": 0.9,
        "adam_beta2": 0.98,
        "adam_eps": 1e-09,
        "weight_decay": 0.0,
        "clip_norm": 0.0,
        "max_tokens": 4096,
        "update_freq": 1,
        "max_len": 256,
        "max_steps": 100000,
        "max_epochs": 0,
        "max_minutes": 0.0,
        "seed": 1,
        "save_every": 1000,
        "keep_last": 5,
        "average_last": 0,
        "log_every": 10,
        "eval_every": 1000,
        "patience": 0,
        "device": "cpu",
        "precision": "auto",
        "target_seq_accuracy": 0.0,
        "valid_beam": 1,
        "tensorboard": True,
    },
    "task": {
        "name": "copy",
        "train_size": 50000,
        "valid_size": 1000,
        "min_digits": 1,
        "max_digits": 3,
        "reverse_input": False,
        "min_length": 1,
        "max_length": 10,
        "n_symbols": 8,
        "data_seed": 1234,
        "train_src": "",
        "train_tgt": "",
        "valid_src": "",
        "valid_tgt": "",
        "vocab_size": 8000,
        "vocab_sample": 0,
        "bpe_dropout": 0.0,
        "max_valid_sentences": 0,
    },
    "decode": {
        "beam": 4,
        "alpha": 0.6,
        "max_len_offset": 50,
        "decode_batch": 256,
        "batch_tokens": 4000,
    },
}

# The state-dict keys of that model, as the code before the change named them (printed by it)
_SUBLAYERS = {
    "encoder": (
        "self_attn.w_q",
        "self_attn.w_k",
        "self_attn.w_v",
        "self_attn.w_o",
        "ffn.w_1",
        "ffn.w_2",
        "norms.0",
        "norms.1",
    ),
    "decoder": (
        "self_attn.w_q",
        "self_attn.w_k",
        "self_attn.w_v",
        "self_attn.w_o",
        "cross_attn.w_q",
        "cross_attn.w_k",
        "cross_attn.w_v",
        "cross_attn.w_o",
        "ffn.w_1",
        "ffn.w_2",
        "norms.0",
        "norms.1",
        "norms.2",
    ),
}
OLD_KEYS = {"encoder.embed.weight", "decoder.embed.weight", "generator.weight"} | {
    f"{side}.layers.0.{m}.{p}"
    for side, ms in _SUBLAYERS.items()
    for m in ms
    for p in ("weight", "bias")
}


def test_a_model_of_the_old_layout_loads(tmp_path: Path) -> None:
    from transduce.config import from_dict
    from transduce.model import make_model

    cfg = from_dict(OLD_CONFIG, stored=True)
    assert cfg.task == SyntheticTaskConfig(name="copy", n_symbols=8)
    model = make_model(cfg.model, src_vocab_size=12)
    state = model.state_dict()
    assert set(state) == OLD_KEYS
    path = tmp_path / "old.pt"
    torch.save(
        {"config": OLD_CONFIG, "vocab": {"kind": "char", "symbols": "abcdefgh"}, "model": state},
        path,
    )
    with pytest.raises(UserError, match="transduce convert"):
        checkpoint.load_model(path)  # files before the safe format: refused, the remedy named
    assert main(["--no-malloc-tuning", "convert", str(path), str(tmp_path / "new.pt")]) == 0
    loaded, vocab, loaded_cfg = checkpoint.load_model(tmp_path / "new.pt")
    assert loaded_cfg.task == cfg.task and len(vocab) == 12
    for key, value in state.items():
        torch.testing.assert_close(loaded.state_dict()[key], value)
