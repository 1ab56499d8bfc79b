"""Training-step speed: transduce against torch.nn.Transformer and Hugging Face MarianMTModel.

One training step is forward + label-smoothed loss + backward + Adam step + zero_grad, on a batch of
64 sentence pairs of 24 source and 24 target tokens (no padding; ``--batch N --src-len S
--tgt-len T`` for others, ``--paper-batch`` for 1024 x (24 + 24): about the paper's 25k target
tokens a batch), on ``--threads`` CPU threads (2 by default). Sizes:

    SMALL  d_model 256, 3+3 layers, 4 heads, d_k = d_v = 64, d_ff 1024, shared vocabulary 8000
    BASE   the paper's base model (d_model 512, 6+6 layers, 8 heads, d_ff 2048), vocabulary 37000

Systems, all with dropout 0.1 on the residuals and embeddings only (none on attention weights or
feed-forward activations: ``nn.Transformer``'s are set to 0 to match), ReLU, post-norm,
sinusoidal positions, embeddings x sqrt(d_model), one embedding matrix shared by source, target
and the pre-softmax projection, the same loss (``transduce.training.loss.label_smoothed_nll``,
eps 0.1) and the same optimizer (``Trainer``'s: ``training.optimizer.make_optimizer``, Adam
with betas (0.9, 0.98), eps 1e-9, fused where torch has it):

    transduce  ``make_model``, stepped by the ``Trainer``'s own code
               (``training.updater.forward_backward``: autocast, the loss with its gradient
               written into the logits, the scaled backward; then the gradient norm and the
               GradScaler's step), i.e. what ``transduce train`` does
    transduce_reference
               the same with the two-pass reference loss (``method="reference"``): the
               ratio ``transduce_reference`` / ``transduce`` is what the fused loss gained
    transduce_compiled
               ``transduce`` with the model compiled in place (``nn.Module.compile``, inductor's
               default mode: what ``train.compile: default`` does); its warm-up steps compile
               (tens of seconds on a CPU), the timed ones run the compiled graphs; in
               bf16-weights the bfloat16 working copy is what is compiled, as in the Trainer
    transduce_cudagraphs
               the same in inductor's ``reduce-overhead`` mode (``train.compile:
               reduce-overhead``: the forward and backward graphs replayed as CUDA graphs,
               one launch each; CUDA only)
    transduce_read_late, transduce_cudagraphs_read_late
               ``transduce`` and ``transduce_cudagraphs`` reading every update's loss and
               gradient norm one update late (``training/late_read.py``: the device skips a
               non-finite update), on any device; the Trainer reads at once (on an H200
               SMALL's graphed step ran 0.80x reading late: benchmarks/RESULTS.md)
    transduce_flash
               ``transduce`` with PyTorch's flash attention kernel left on (``Trainer.train``
               turns it off on CUDA, where the memory-efficient kernel was faster on short
               sentences); the same as ``transduce`` elsewhere
    (the transduce systems train as ``Trainer.train`` does, under
    ``kernels.training_attention``: on CUDA without cuDNN's attention or the flash kernel,
    which the peers keep)
    torch      ``torch.nn.Transformer(batch_first=True)`` with the same embeddings and positions
               (it adds a final LayerNorm to encoder and decoder, which the paper's model lacks)
    hf         ``transformers.MarianMTModel`` (MarianConfig of the same sizes, relu, static
               sinusoidal positions, scale_embedding, tied embeddings, default SDPA attention)

Each runs in float32 and under ``torch.autocast(DEVICE, dtype=torch.bfloat16)`` (float32 master
weights; the loss is computed outside autocast, as ``Trainer`` does); ``--precisions
bf16-weights`` adds the transduce systems in ``train.precision: bf16-weights`` (forward and
backward on a bfloat16 copy of the model cast once per update, ``training/working_weights.py``;
the JSON's ``*_bf16_weights_over_bf16`` is its speed over autocast's). Timings on a shared machine
are noisy, so the systems run interleaved in one process (round r runs every system and
precision, in a rotating order) and the ratios are medians of per-round ratios.

Model FLOPs, counted analytically over the matmuls only (a multiply-add is 2 FLOPs and the
backward pass costs twice the forward, so 6 FLOPs per multiply-add of the forward pass):

    FLOPs/step = 6 * [ B*S * (N_enc + N_ckv) + B*T * (N_dec - N_ckv) + B*T * D*V
                       + B * L * H * (K + Dv) * (S*S + T*T + T*S) ]

N_enc / N_dec: weight-matrix entries of all encoder / decoder layers (biases and LayerNorm left
out); N_ckv: those of the encoder-decoder W^K and W^V, which act on the S source positions;
D*V: the pre-softmax projection (the embedding lookups are no matmuls); the last term: Q K^T and
A V of encoder self-, decoder self- (the full T x T, causal not halved) and encoder-decoder
attention. Divided by the B*T target tokens this is about 6 x (matrix parameters) plus the
attention term: 46.0 MFLOP per target token for SMALL, 380.6 for BASE. MFU = (FLOPs/step) /
(seconds/step) / peak, the peak being the best FLOP/s of a 1024^3 and a 2048^3 product loop
(``torch.mm``, and oneDNN's on a CPU: see ``measure_peak``) measured in the same process before
and after the timed steps, with the same threads (the fp32 peak for fp32 runs, the bf16 peak for
bf16 and bf16-weights runs).

Peak memory of a step, per system and precision (one extra step after the timed ones), as the
rise over what was there before the step: what the step itself needs (activations, gradients,
temporaries), the weights and Adam's state left out, as the systems share one process. On a GPU
``torch.cuda.max_memory_allocated`` less ``memory_allocated`` before (``cuda_allocated_rise``);
on a CPU the process's peak resident set less its resident set before (``rss_peak_rise``:
Linux's VmHWM, reset through /proc/self/clear_refs; what the allocator keeps cached from earlier
steps is not counted again: with malloc tuning on, glibc keeps freed memory and a step reuses it,
so the rise reads near 0; read the ``malloc_off`` figures). Where the peak cannot be reset,
``memory`` is ``none`` and the figures are left out.

glibc malloc tuning (``transduce.runtime.tune_malloc``) cannot be undone inside a process, so each
configuration runs in its own subprocess: ``on`` calls ``tune_malloc()`` first (all three systems
share the process and so all profit), ``off`` runs with TRANSDUCE_MALLOC_TUNING=0. The headline
JSON figures are from ``on`` (what ``transduce train`` does); the ``off`` figures sit under
``"malloc_off"``.

    python benchmarks/train_step.py [--quick] [--malloc both|on|off] [--rounds N] [--threads 2]
                                    [--device cuda] [--sizes base] [--precisions bf16]
                                    [--batch 64 --src-len 24 --tgt-len 24 | --paper-batch]

On a GPU (``--device cuda``) the same steps run there, timed with the device synchronised, the
peak measured there (4096^3 and 8192^3 products), 20 steps a round; fp32 means true float32
(PyTorch's default: no TF32 for matrix products).

Needs ``transformers`` (``pip install -e .[bench]``); it is imported here only, never by the
package.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decode  # noqa: E402  (benchmarks/decode.py: the model sizes shared with it)

PAD, BOS, EOS = 0, 2, 3
BATCH, SRC_LEN, TGT_LEN = 64, 24, 24
PAPER_BATCH = 1024  # x (24 + 24): 24,576 target tokens, about the paper's 25k a batch
DROPOUT, LABEL_SMOOTHING = 0.1, 0.1
LR = 1e-4  # every system's, constant

SIZES: dict[str, dict[str, int]] = decode.SIZES  # SMALL and BASE, as decode.py times them
SYSTEMS = (
    "transduce",
    "transduce_reference",
    "transduce_compiled",
    "transduce_cudagraphs",
    "transduce_read_late",
    "transduce_cudagraphs_read_late",
    "transduce_flash",
    "torch",
    "hf",
)
DEFAULT_SYSTEMS = ("transduce", "transduce_reference", "torch", "hf")  # compiling takes minutes
PRECISIONS = ("fp32", "bf16", "bf16-weights")
DEFAULT_PRECISIONS = ("fp32", "bf16")
# (warm-up steps per system and precision, timed steps per round, rounds)
SCHEDULE = {"small": (2, 2, 7), "base": (1, 1, 5)}
GPU_SCHEDULE = (5, 20, 7)  # a GPU step takes milliseconds: more of them per timing
PEAK_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "bf16-weights": torch.bfloat16}


# ------------------------------------------------------------------------------------------------
# FLOPs


def flops_per_step(
    size: dict[str, int], batch: int = BATCH, s: int = SRC_LEN, t: int = TGT_LEN
) -> float:
    """Matmul FLOPs of one training step (forward 2 per multiply-add, backward 2x forward)."""
    d, f, h, k, dv, n, v = (
        size[x] for x in ("d_model", "d_ff", "n_heads", "d_k", "d_v", "n_layers", "vocab")
    )
    attn_proj = d * h * k * 2 + d * h * dv + h * dv * d  # W^Q, W^K, W^V, W^O entries
    ffn = 2 * d * f
    src_tok, tgt_tok = batch * s, batch * t
    enc_linear = n * (attn_proj + ffn) * src_tok
    cross_kv = n * (d * h * k + d * h * dv) * src_tok  # encoder-decoder K/V on the memory
    dec_linear = n * (attn_proj + (d * h * k + h * dv * d) + ffn) * tgt_tok  # self + cross Q, O
    out_proj = d * v * tgt_tok
    attn_scores = batch * n * h * (k + dv) * (s * s + t * t + t * s)  # QK^T + AV (mult-adds)
    return 6.0 * (enc_linear + cross_kv + dec_linear + out_proj + attn_scores)


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously; a CPU has nothing queued)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _onednn_takes(dtype: torch.dtype) -> bool:
    """Whether oneDNN's inner product runs in ``dtype`` on this CPU (bfloat16 needs AVX512-BF16
    or AMX on some builds: without them it refuses to make the primitive)."""
    from transduce.kernels.matmul import onednn_linear

    try:
        onednn_linear(torch.ones(2, 2, dtype=dtype), torch.ones(2, 2, dtype=dtype), None)
    except RuntimeError:
        return False
    return True


def measure_peak(
    dtype: torch.dtype, device: torch.device = torch.device("cpu"), reps: int = 5
) -> float:
    """Best FLOP/s of n x n x n products (``reps`` runs after a warm-up, each n): n = 1024
    and 2048 on a CPU, 4096 and 8192 on a GPU (smaller products leave a GPU idle part of the
    time). ``torch.mm``, and on a CPU also ``transduce.kernels.linear`` with oneDNN: on CPUs
    not made by Intel MKL's float32 sgemm (``torch.mm``) reaches half of what the machine does."""
    from transduce.kernels.matmul import onednn_available, onednn_linear

    products = [torch.mm]
    if device.type == "cpu" and onednn_available() and _onednn_takes(dtype):
        products.append(lambda a, b: onednn_linear(a, b, None))  # a b^T: the FLOPs of a b

    best = 0.0
    for n in (1024, 2048) if device.type == "cpu" else (4096, 8192):
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        for product in products:
            product(a, b)
            for _ in range(reps):
                sync(device)
                t0 = time.perf_counter()
                product(a, b)
                sync(device)
                best = max(best, 2.0 * n**3 / (time.perf_counter() - t0))
    return best


# ------------------------------------------------------------------------------------------------
# peak memory of a step


def _status_kib(field: str) -> int:
    """A ``VmHWM`` / ``VmRSS`` line of /proc/self/status, in KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"no {field} in /proc/self/status")


def memory_measure(device: torch.device) -> str:
    """How ``step_peak_mib`` measures on ``device``: ``cuda_allocated_rise``, ``rss_peak_rise``
    (Linux, the peak resettable) or ``none``."""
    if device.type == "cuda":
        return "cuda_allocated_rise"
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux 4.0+)
        _status_kib("VmHWM")
    except OSError:
        return "none"
    return "rss_peak_rise"


def step_peak_mib(step: Callable[[], None], device: torch.device, measure: str) -> float | None:
    """Peak memory of one call of ``step`` over the level before it, in MiB, as ``measure`` says
    (``memory_measure``): allocated tensors on a GPU, the resident set on a CPU."""
    if measure == "cuda_allocated_rise":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step()
        sync(device)
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20
    if measure == "rss_peak_rise":
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = _status_kib("VmRSS")
        step()
        return max(0, _status_kib("VmHWM") - before) / 1024
    return None


# ------------------------------------------------------------------------------------------------
# the three systems: each returns (model, forward(src, tgt_in) -> logits (B, T, V))


Forward = Callable[[Tensor, Tensor], Tensor]


def build_transduce(size: dict[str, int]) -> tuple[nn.Module, Forward]:
    from transduce.config import ModelConfig
    from transduce.model import make_model

    cfg = ModelConfig(
        n_layers=size["n_layers"],
        d_model=size["d_model"],
        d_ff=size["d_ff"],
        n_heads=size["n_heads"],
        d_k=size["d_k"],
        d_v=size["d_v"],
        dropout=DROPOUT,
    )
    model = make_model(cfg, src_vocab_size=size["vocab"], pad_id=PAD)
    return model, model


class TorchSeq2Seq(nn.Module):
    """``torch.nn.Transformer`` with the paper's embeddings, positions and tied projection."""

    def __init__(self, size: dict[str, int]) -> None:
        from transduce.model.positions import positional_table

        super().__init__()
        d = size["d_model"]
        self.scale = math.sqrt(d)
        self.embed = nn.Embedding(size["vocab"], d)
        nn.init.normal_(self.embed.weight, std=d**-0.5)
        self.register_buffer("pe", positional_table(1024, d), persistent=False)
        self.dropout = nn.Dropout(DROPOUT)
        self.core = nn.Transformer(
            d_model=d,
            nhead=size["n_heads"],
            num_encoder_layers=size["n_layers"],
            num_decoder_layers=size["n_layers"],
            dim_feedforward=size["d_ff"],
            dropout=DROPOUT,
            activation="relu",
            batch_first=True,
        )
        # nn.Transformer's dropout also drops attention weights and the feed-forward activations;
        # the paper (and the other two systems here) drop only the residuals and embeddings
        for layer in [*self.core.encoder.layers, *self.core.decoder.layers]:
            layer.dropout.p = 0.0  # inside the feed-forward block
            for attn in (layer.self_attn, getattr(layer, "multihead_attn", None)):
                if attn is not None:
                    attn.dropout = 0.0

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        x = self.dropout(self.embed(src) * self.scale + self.pe[: src.size(1)])
        y = self.dropout(self.embed(tgt) * self.scale + self.pe[: tgt.size(1)])
        pad = src == PAD  # (B, S), True on padding (nn.Transformer's convention)
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.size(1), device=tgt.device)
        h = self.core(
            x,
            y,
            tgt_mask=causal,
            src_key_padding_mask=pad,
            memory_key_padding_mask=pad,
            tgt_is_causal=True,
        )
        return nn.functional.linear(h, self.embed.weight)  # tied pre-softmax projection


def build_torch(size: dict[str, int]) -> tuple[nn.Module, Forward]:
    model = TorchSeq2Seq(size)
    return model, model


def build_hf(size: dict[str, int]) -> tuple[nn.Module, Forward]:
    from transformers import MarianConfig, MarianMTModel

    if size["d_k"] * size["n_heads"] != size["d_model"] or size["d_v"] != size["d_k"]:
        raise ValueError("Marian needs d_k = d_v = d_model / n_heads")
    cfg = MarianConfig(
        vocab_size=size["vocab"],
        decoder_vocab_size=size["vocab"],
        d_model=size["d_model"],
        encoder_layers=size["n_layers"],
        decoder_layers=size["n_layers"],
        encoder_attention_heads=size["n_heads"],
        decoder_attention_heads=size["n_heads"],
        encoder_ffn_dim=size["d_ff"],
        decoder_ffn_dim=size["d_ff"],
        activation_function="relu",
        dropout=DROPOUT,
        attention_dropout=0.0,
        activation_dropout=0.0,
        scale_embedding=True,
        pad_token_id=PAD,
        decoder_start_token_id=BOS,
        eos_token_id=EOS,
        forced_eos_token_id=None,
        max_position_embeddings=1024,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
    )
    model = MarianMTModel(cfg)
    assert model.config._attn_implementation == "sdpa", model.config._attn_implementation
    assert model.lm_head.weight is model.model.shared.weight

    def forward(src: Tensor, tgt: Tensor) -> Tensor:
        out = model(
            input_ids=src,
            attention_mask=(src != PAD).long(),
            decoder_input_ids=tgt,
            use_cache=False,
        )
        return out.logits

    return model, forward


BUILDERS = {
    "transduce": build_transduce,
    "transduce_reference": build_transduce,
    "transduce_compiled": build_transduce,
    "transduce_cudagraphs": build_transduce,
    "transduce_read_late": build_transduce,
    "transduce_cudagraphs_read_late": build_transduce,
    "transduce_flash": build_transduce,
    "torch": build_torch,
    "hf": build_hf,
}
# the systems stepped by the Trainer's code, and the loss method of each
TRAINER_SYSTEMS = {
    "transduce": "auto",
    "transduce_reference": "reference",
    "transduce_compiled": "auto",
    "transduce_cudagraphs": "auto",
    "transduce_read_late": "auto",
    "transduce_cudagraphs_read_late": "auto",
    "transduce_flash": "auto",
}
# the systems compiled, and inductor's mode for each (None: the default mode)
COMPILE_MODES: dict[str, str | None] = {
    "transduce_compiled": None,
    "transduce_cudagraphs": "reduce-overhead",
    "transduce_cudagraphs_read_late": "reduce-overhead",
}


@dataclass
class Runner:
    """One system: model, optimizer and a ``step(precision)`` that does one training update."""

    model: nn.Module
    forward: Forward
    optimizer: torch.optim.Optimizer

    def step(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor, precision: str) -> None:
        from transduce.training.loss import label_smoothed_nll

        with torch.autocast(src.device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = self.forward(src, tgt_in)
        sums = label_smoothed_nll(logits, tgt_out, epsilon=LABEL_SMOOTHING, ignore_index=PAD)
        (sums.loss / sums.n_tokens).backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


@dataclass
class TrainerRunner(Runner):
    """transduce's model stepped by the ``Trainer``'s own code (``training.updater.Updater``:
    forward and backward, the gradient norm, the read of the update's numbers and Adam's step,
    read as the Trainer reads them, or one update late with ``late`` True), the loss computed by
    ``loss_method``: "auto" (what ``transduce train`` does) or "reference" (the two-pass loss,
    ``transduce_reference``)."""

    loss_method: str = "auto"
    compiles: bool = False  # the compiled systems: the module that runs compiled in place
    compile_mode: str | None = None  # inductor's mode (None: its default)
    late: bool | None = None  # None: read as the Trainer reads (late_read.pays); True: late
    flash: bool = False  # keep PyTorch's flash attention on CUDA (the Trainer turns it off)
    _updaters: dict[str, Any] = field(default_factory=dict)  # precision -> the Trainer's Updater
    _tokens: tuple[Tensor, int] | None = None  # tgt_out and its tokens
    _pending: Any = None  # the update left unread (reading late)
    _last: str | None = None  # the precision of the last step

    def _compile(self, net: nn.Module) -> None:
        """``net`` (the master model, or the working copy in bf16-weights) compiled in place at
        its first step, as ``training.compiling`` compiles the module that runs."""
        if getattr(net, "_compiled_call_impl", None) is None:
            net.compile(mode=self.compile_mode)

    def step(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor, precision: str) -> None:
        from transduce.kernels import training_attention

        # the attention backends Trainer.train uses (transduce_flash: flash kept)
        with training_attention(src.device, flash=self.flash):
            self._step(src, tgt_in, tgt_out, precision)

    def _step(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor, precision: str) -> None:
        from transduce.data.batching import Batch
        from transduce.training import late_read

        # the Trainer counts a batch's tokens on the host as it makes the batch: once here
        if self._tokens is None or self._tokens[0] is not tgt_out:
            self._tokens = (tgt_out, int((tgt_out != PAD).sum()))
        net = self.model
        if precision == "bf16-weights":
            if self._last != precision:  # other precisions' steps changed the master weights
                self._updater(precision).working.refresh()  # (then each step refreshes it)
            net = self._updater(precision).net().train()
        self._last = precision
        if self.compiles:
            self._compile(net)
            if self.compile_mode == "reduce-overhead":  # a new step: the graphs' outputs free
                torch.compiler.cudagraph_mark_step_begin()
        updater = self._updater(precision)
        group = [Batch(src, tgt_in, tgt_out, self._tokens[1])]
        # as the Trainer (late where late_read.pays), or late wherever fused Adam can skip
        late = late_read.pays(src.device) if self.late is None else self.late
        if late and late_read.applies(self.optimizer):
            pending = updater.launch(group, LR)
            if self._pending is not None:
                updater.resolve(self._pending, False)
            self._pending = pending
        else:
            updater.at_once(group, LR, lambda: False)

    @property
    def working(self) -> Any:
        """bf16-weights' bfloat16 working copy (None before that precision's first step)."""
        updater = self._updaters.get("bf16-weights")
        return None if updater is None else updater.working

    def _updater(self, precision: str) -> Any:
        """The Trainer's ``Updater`` for ``precision`` (made at its first step)."""
        from transduce.config import TrainConfig
        from transduce.training.distributed import World
        from transduce.training.precision import grad_scaler
        from transduce.training.updater import Updater
        from transduce.training.working_weights import WorkingWeights

        if precision not in self._updaters:
            device = next(self.model.parameters()).device
            working = WorkingWeights(self.model) if precision == "bf16-weights" else None
            self._updaters[precision] = Updater(
                TrainConfig(label_smoothing=LABEL_SMOOTHING, clip_norm=0.0),
                self.model,
                self.optimizer,
                grad_scaler(precision, device),  # disabled but for fp16, as in Trainer
                precision=precision,
                world=World(rank=0, size=1),
                device=device,
                working=working,
                ddp=None,
                loss_method=self.loss_method,  # type: ignore[arg-type]
            )
        return self._updaters[precision]


def make_runner(system: str, size: dict[str, int], device: torch.device) -> Runner:
    from transduce.training.compiling import check_mode
    from transduce.training.optimizer import make_optimizer

    if system in COMPILE_MODES:  # CUDA graphs on a CPU: refused, as train.compile refuses them
        check_mode(COMPILE_MODES[system] or "default", device)
    torch.manual_seed(0)
    model, forward = BUILDERS[system](size)
    model.to(device).train()
    # the Trainer's optimizer (Adam, fused where torch has it) for every system
    opt = make_optimizer(model, betas=(0.9, 0.98), eps=1e-9)
    for group in opt.param_groups:
        group["lr"] = LR
    if system in TRAINER_SYSTEMS:
        return TrainerRunner(
            model,
            forward,
            opt,
            loss_method=TRAINER_SYSTEMS[system],
            compiles=system in COMPILE_MODES,
            compile_mode=COMPILE_MODES.get(system),
            late=True if system.endswith("_read_late") else None,
            flash=system == "transduce_flash",
        )
    return Runner(model, forward, opt)


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def matrix_params(model: nn.Module) -> int:
    """Trainable parameters with 2+ dims, each shared tensor once (embeddings included)."""
    seen = {id(p): p for p in model.parameters() if p.requires_grad and p.dim() >= 2}
    return sum(p.numel() for p in seen.values())


# ------------------------------------------------------------------------------------------------
# worker: measures every system in one process


def run_worker(args: argparse.Namespace) -> dict:
    from transduce.runtime import tune_malloc

    tuned = tune_malloc()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    batch, src_len, tgt_len = args.batch, args.src_len, args.tgt_len
    measure = memory_measure(device)
    result: dict = {
        "malloc_tuning": tuned,
        "threads": torch.get_num_threads(),
        "sizes": {},
        "device": describe_device(device),
        "shape": [batch, src_len, tgt_len],
        "memory": measure,
    }
    # the precisions timed only: a CPU without bfloat16 emulates it, minutes a product
    by_dtype = {d: measure_peak(d, device) for d in {PEAK_DTYPES[p] for p in args.precisions}}
    peaks = {p: by_dtype[PEAK_DTYPES[p]] for p in args.precisions}
    g = torch.Generator().manual_seed(1)
    for size_name in args.sizes:
        size = SIZES[size_name]
        v = size["vocab"]
        src = torch.randint(4, v, (batch, src_len), generator=g).to(device)
        tgt = torch.randint(4, v, (batch, tgt_len + 1), generator=g).to(device)
        tgt_in, tgt_out = tgt[:, :-1].contiguous(), tgt[:, 1:].contiguous()
        warmup, steps, rounds = SCHEDULE[size_name] if device.type == "cpu" else GPU_SCHEDULE
        rounds = args.rounds or rounds
        runners = {s: make_runner(s, size, device) for s in args.systems}
        # bf16-weights is the Trainer's: the peers have no such mode
        keys = [
            (s, p)
            for s in args.systems
            for p in args.precisions
            if p != "bf16-weights" or s in TRAINER_SYSTEMS
        ]
        for s, p in keys:
            for _ in range(warmup):
                runners[s].step(src, tgt_in, tgt_out, p)
        times: dict[str, list[float]] = {f"{s}/{p}": [] for s, p in keys}
        for r in range(rounds):
            order = keys[r % len(keys) :] + keys[: r % len(keys)]  # rotate who goes first
            for s, p in order:
                sync(device)
                t0 = time.perf_counter()
                for _ in range(steps):
                    runners[s].step(src, tgt_in, tgt_out, p)
                sync(device)
                times[f"{s}/{p}"].append((time.perf_counter() - t0) / steps)
            print(
                f"  [{size_name} round {r + 1}/{rounds}] "
                + " ".join(f"{k}={v[-1] * 1e3:.0f}ms" for k, v in times.items()),
                file=sys.stderr,
                flush=True,
            )
        memory: dict[str, float | None] = {}
        for s, p in keys:
            if COMPILE_MODES.get(s) == "reduce-overhead":  # the graphs' memory is set aside
                memory[f"{s}/{p}"] = None  # when they are captured: a step allocates nothing
                continue
            step = functools.partial(runners[s].step, src, tgt_in, tgt_out, p)
            memory[f"{s}/{p}"] = step_peak_mib(step, device, measure)
        # the peak again, after the heavy work: the better of the two is the machine's peak now
        again = {d: measure_peak(d, device) for d in {PEAK_DTYPES[p] for p in peaks}}
        peaks = {p: max(peaks[p], again[PEAK_DTYPES[p]]) for p in peaks}
        result["sizes"][size_name] = {
            "seconds_per_step": times,
            "flops_per_step": flops_per_step(size, batch, src_len, tgt_len),
            "matrix_params": {s: matrix_params(r.model) for s, r in runners.items()},
            "peak_mib": memory,
        }
        del runners
    result["peak_flops"] = peaks
    return result


# ------------------------------------------------------------------------------------------------
# parent: one subprocess per malloc configuration, then the table and the JSON line


def summarise(res: dict) -> tuple[list[list[str]], dict]:
    rows: list[list[str]] = []
    out: dict = {}
    batch, _, tgt_len = res.get("shape", (BATCH, SRC_LEN, TGT_LEN))
    tokens = batch * tgt_len
    for size_name, sres in res["sizes"].items():
        times = sres["seconds_per_step"]
        flops = sres["flops_per_step"]
        out[f"{size_name}_flops_per_target_token"] = flops / tokens
        for p in PRECISIONS:
            if f"transduce/{p}" not in times:
                continue
            ours = times[f"transduce/{p}"]
            pk = p.replace("-", "_")  # bf16-weights -> bf16_weights in the JSON keys
            for s in SYSTEMS:
                key = f"{s}/{p}"
                if key not in times:
                    continue
                med = statistics.median(times[key])
                tps = tokens / med
                mfu = flops / med / res["peak_flops"][p]
                ratio = statistics.median(th / us for th, us in zip(times[key], ours))
                mib = sres.get("peak_mib", {}).get(key)
                out[f"{size_name}_{pk}_{s}_tokens_per_s"] = round(tps, 1)
                out[f"{size_name}_{pk}_{s}_mfu"] = round(mfu, 4)
                out[f"{size_name}_{pk}_{s}_peak_mib"] = None if mib is None else round(mib, 1)
                if s == "transduce":
                    out[f"{size_name}_{pk}_mfu"] = round(mfu, 4)
                else:
                    out[f"{size_name}_{pk}_vs_{s}"] = round(ratio, 3)
                rows.append(
                    [
                        size_name,
                        p,
                        s,
                        f"{tps:,.0f}",
                        f"{med * 1e3:,.0f}",
                        f"{min(times[key]) * 1e3:,.0f}",
                        f"{mfu:.1%}",
                        "-" if mib is None else f"{mib:,.0f}",
                        "1.00" if s == "transduce" else f"{ratio:.2f}",
                    ]
                )
        for slow, fast, name in (
            ("fp32", "bf16", "bf16_over_fp32"),
            ("bf16", "bf16-weights", "bf16_weights_over_bf16"),
        ):
            if f"transduce/{slow}" in times and f"transduce/{fast}" in times:
                pairs = zip(times[f"transduce/{slow}"], times[f"transduce/{fast}"])
                out[f"{size_name}_{name}"] = round(statistics.median(a / b for a, b in pairs), 3)
    for p in ("fp32", "bf16"):  # the precisions timed only (--precisions bf16: no fp32 peak)
        if p in res["peak_flops"]:
            out[f"peak_{p}_gflops"] = round(res["peak_flops"][p] / 1e9, 1)
    return rows, out


def print_table(title: str, rows: list[list[str]]) -> None:
    head = ["size", "prec", "system", "tgt tok/s", "ms/step", "best ms", "MFU", "peak MiB"]
    head.append("ours/theirs")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    print(f"\n{title}")
    for r in [head, *rows]:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))


def positive(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1; got {value}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; ``--paper-batch`` sets batch, src_len and tgt_len (and refuses others)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="SMALL only")
    parser.add_argument("--malloc", choices=["both", "on", "off"], default="both")
    parser.add_argument("--rounds", type=int, default=0, help="0 = the default per size")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--device", default="cpu", help="cpu (default) or cuda[:N]; on a GPU, malloc tuning on only"
    )
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=None)
    parser.add_argument(
        "--systems", nargs="+", choices=list(SYSTEMS), default=list(DEFAULT_SYSTEMS)
    )
    parser.add_argument(
        "--precisions",
        nargs="+",
        choices=list(PRECISIONS),
        default=list(DEFAULT_PRECISIONS),
        help="bf16-weights (train.precision bf16-weights) for the transduce systems only",
    )
    parser.add_argument("--batch", type=positive, default=None, help=f"sentences ({BATCH})")
    parser.add_argument("--src-len", type=positive, default=None, help=f"tokens ({SRC_LEN})")
    parser.add_argument("--tgt-len", type=positive, default=None, help=f"tokens ({TGT_LEN})")
    parser.add_argument(
        "--paper-batch",
        action="store_true",
        help=f"{PAPER_BATCH} sentences x ({SRC_LEN} + {TGT_LEN}) tokens: the paper's ~25k target "
        "tokens a batch",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    given = [args.batch, args.src_len, args.tgt_len]
    if args.paper_batch and any(x is not None for x in given):
        parser.error("--paper-batch sets --batch, --src-len and --tgt-len: give one or the other")
    default = (PAPER_BATCH if args.paper_batch else BATCH, SRC_LEN, TGT_LEN)
    args.batch, args.src_len, args.tgt_len = (
        d if x is None else x for x, d in zip(given, default, strict=True)
    )
    if args.sizes is None:
        args.sizes = ["small"] if args.quick else ["small", "base"]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(run_worker(args)), flush=True)
        return

    results: dict[str, dict] = {}
    settings = ["on", "off"] if args.malloc == "both" else [args.malloc]
    if args.device != "cpu":
        settings = ["on"]  # host malloc settings do not reach a GPU's memory
    for setting in settings:
        env = dict(os.environ, TRANSDUCE_MALLOC_TUNING="1" if setting == "on" else "0")
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--worker",
            "--rounds",
            str(args.rounds),
            "--threads",
            str(args.threads),
            "--device",
            args.device,
            "--sizes",
            *args.sizes,
            "--systems",
            *args.systems,
            "--precisions",
            *args.precisions,
            "--batch",
            str(args.batch),
            "--src-len",
            str(args.src_len),
            "--tgt-len",
            str(args.tgt_len),
        ]
        print(f"malloc tuning {setting}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, check=True)
        line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
        results[setting] = json.loads(line[len("RESULT ") :])

    summary: dict = {"benchmark": "train_step"}
    for setting, res in results.items():
        rows, out = summarise(res)
        print_table(
            f"{res['device']}, malloc tuning {setting} (applied: {res['malloc_tuning']}), "
            f"{res['threads']} threads, batch {args.batch} x ({args.src_len} src, "
            f"{args.tgt_len} tgt), peak memory: {res['memory']}, "
            f"peak fp32 {out.get('peak_fp32_gflops', '-')} GFLOP/s, bf16 "
            f"{out.get('peak_bf16_gflops', '-')} GFLOP/s",
            rows,
        )
        if setting == list(results)[0]:
            summary.update(malloc_tuning=setting, **out)
        else:
            summary[f"malloc_{setting}"] = out
    for size_name in args.sizes:
        print(
            f"{size_name}: {summary.get(f'{size_name}_flops_per_target_token', 0) / 1e6:.1f} "
            "MFLOP per target token"
        )
    for key in (
        "small_fp32_vs_hf",
        "small_fp32_vs_torch",
        "small_bf16_vs_hf",
        "small_bf16_vs_torch",
        "base_fp32_vs_hf",
        "base_fp32_vs_torch",
        "base_bf16_vs_hf",
        "base_bf16_vs_torch",
        "small_fp32_mfu",
    ):
        summary.setdefault(key, None)
    summary.update(
        batch=args.batch,
        src_len=args.src_len,
        tgt_len=args.tgt_len,
        memory=results[settings[0]]["memory"],
        torch=torch.__version__,
        machine=describe_device(torch.device("cpu")),
        cpus=os.cpu_count(),
        device=results[settings[0]]["device"],
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
