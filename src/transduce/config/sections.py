"""The config sections as frozen, typed dataclasses, checked on construction: ``ModelConfig``,
``TrainConfig``, one task dataclass per task, ``DecodeConfig``, and ``Config`` of the four."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal, get_args

from transduce.config.values import _hints, _typed
from transduce.errors import UserError


class _Section:
    """What every section does on construction: check each value's type (an int is taken for a
    float), then the section's own ranges (``_check``)."""

    section: ClassVar[str]

    def __post_init__(self) -> None:
        hints = _hints(type(self))
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            checked = _typed(f"{self.section}.{f.name}", hints[f.name], value, from_text=False)
            if checked is not value:
                object.__setattr__(self, f.name, checked)
        self._check()

    def _check(self) -> None:
        """Range and cross-field checks of the section (UserErrors naming the key)."""


def _positive(cfg: object, *keys: str) -> None:
    for key in keys:
        if getattr(cfg, key) <= 0:
            raise UserError(f"{key} must be positive; got {getattr(cfg, key)}")


def _not_negative(cfg: object, *keys: str) -> None:
    for key in keys:
        if getattr(cfg, key) < 0:
            raise UserError(f"{key} must not be negative; got {getattr(cfg, key)}")


def _fraction(cfg: object, *keys: str) -> None:
    for key in keys:
        if not 0.0 <= getattr(cfg, key) < 1.0:
            raise UserError(f"{key} must be in [0, 1); got {getattr(cfg, key)}")


@dataclass(frozen=True)
class ModelConfig(_Section):
    """Model shape (the paper's names, Table 3 columns)."""

    section: ClassVar[str] = "model"
    n_layers: int = 6
    d_model: int = 512
    d_ff: int = 2048
    n_heads: int = 8
    d_k: int = 64
    d_v: int = 64
    dropout: float = 0.1  # P_drop: residual and embedding dropout
    attention_dropout: float = 0.0  # on attention weights; not in the paper
    activation_dropout: float = 0.0  # after the FFN's ReLU; not in the paper
    positional: Literal["sinusoidal", "learned"] = "sinusoidal"
    max_positions: int = 1024  # size of the learned table (and initial sinusoid table)
    norm: Literal["post", "pre"] = "post"  # post: LayerNorm(x + Sublayer(x)) as in the paper
    tie_embeddings: bool = True  # share embeddings with the pre-softmax projection (3.4)
    # transformer: the paper's model. rnn: the recurrent baseline it argues against
    # (transduce.recurrent: a bidirectional LSTM encoder and an attentional LSTM decoder, with
    # d_model as embedding and hidden size, n_layers, dropout and tie_embeddings as above)
    architecture: Literal["transformer", "rnn"] = "transformer"
    rnn_attention: Literal["general", "additive"] = "general"  # rnn: Luong's or Bahdanau's
    # rnn: the last attentional state fed to the next step (Luong). Off: in short Multi30k runs it
    # learned slower per update and costs 1.2-1.3x a step (benchmarks/RESULTS.md, the LSTM tuned)
    input_feeding: bool = False
    # the Transformer's, beyond the paper, for parsing: token (the paper's) or word: a source
    # piece's position is its word's index and a decoder input's the number of word slots before
    # it, so the query for the next slot and the key of its word share a position (the decoder
    # need not count the words it placed); rnn has no positions and refuses it
    position_unit: Literal["token", "word"] = "token"
    # the Transformer's, beyond the paper, for models made elsewhere (Marian / OPUS-MT,
    # transduce.export.huggingface); rnn refuses them. The FFN's activation: relu (eq. 2),
    # swish (SiLU, x * sigmoid(x)) or gelu (erf form)
    activation: Literal["relu", "swish", "gelu"] = "relu"
    # a bias on the pre-softmax projection (Marian's final_logits_bias); off: the paper's
    output_bias: bool = False

    def _check(self) -> None:
        _positive(self, "n_layers", "d_model", "d_ff", "n_heads", "d_k", "d_v", "max_positions")
        _fraction(self, "dropout", "attention_dropout", "activation_dropout")
        for owner, keys in ARCHITECTURE_KEYS.items():
            if owner == self.architecture:
                continue
            for f in fields(self):
                if f.name in keys and getattr(self, f.name) != f.default:
                    raise UserError(
                        f"{f.name} is a key of architecture: {owner}, which architecture: "
                        f"{self.architecture} ignores; got {getattr(self, f.name)!r} (remove it)"
                    )


# The model keys that one architecture alone reads (``build_model``); the others (architecture,
# n_layers, d_model, dropout, tie_embeddings) both do. A key of the other architecture off its
# default is refused, as a key of another task is: it would be ignored without a word.
ARCHITECTURE_KEYS: dict[str, tuple[str, ...]] = {
    "transformer": (
        "d_ff",
        "n_heads",
        "d_k",
        "d_v",
        "attention_dropout",
        "activation_dropout",
        "positional",
        "max_positions",
        "norm",
        "position_unit",
        "activation",
        "output_bias",
    ),
    "rnn": ("rnn_attention", "input_feeding"),
}


@dataclass(frozen=True)
class TrainConfig(_Section):
    """Training recipe (section 5)."""

    section: ClassVar[str] = "train"
    label_smoothing: float = 0.1
    warmup: int = 4000
    lr_factor: float = 1.0  # multiplies the schedule of eq. 3
    cooldown: float = 0.0  # anneal the lr linearly to 0 over this last share of the budget
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_eps: float = 1e-9
    # decoupled (AdamW) on matrices, per step p -= lr * weight_decay * p; 0 = none, the paper
    weight_decay: float = 0.0
    clip_norm: float = 0.0  # 0 = no gradient clipping
    # an update whose loss or gradient norm is not finite is skipped (training/guard.py); this
    # many skipped in a row stop the run (exit code 3). At least 1: skipping forever, the step
    # counter never reaching max_steps, would never end
    max_bad_updates: int = 20
    max_tokens: int = 4096  # source+target-padded tokens per batch (max of the two)
    update_freq: int = 1  # batches accumulated per optimizer step
    # each batch's source and target padded to a multiple of this, counted so in max_tokens:
    # fewer distinct shapes, each of which costs the CPU matrix library a kernel compile, a GPU
    # a torch.compile recompile or CUDA graph (1 = none). auto: 8 on a CUDA device or with
    # compile on, else 1 (training.feed.pad_multiple_for; so a resume on another kind of device
    # may cut the epoch's batches anew)
    pad_multiple: int | Literal["auto"] = 1
    max_len: int = 256  # training pairs with a longer side are dropped
    max_steps: int = 100_000
    max_epochs: int = 0  # 0 = no limit
    max_minutes: float = 0.0  # wall-clock budget; 0 = no limit
    seed: int = 1
    save_every: int = 1000  # optimizer steps between checkpoints
    keep_last: int = 5  # periodic checkpoints kept
    average_last: int = 0  # average this many last checkpoints at the end (0 = off)
    log_every: int = 10
    eval_every: int = 1000  # steps between validations (0 = only at the end)
    patience: int = 0  # early stopping after this many validations without gain (0 = off)
    device: str = "cpu"
    # bf16: autocast to bfloat16 (CPUs with bfloat16 instructions, GPUs); fp16: autocast to
    # float16 with loss scaling (GPUs); fp32 master weights in both. bf16-weights: forward and
    # backward on a bfloat16 copy of the model cast once per update, activations bfloat16
    # throughout, fp32 master weights (training/working_weights.py). auto: where the device
    # computes in bfloat16 natively (training.precision.native_bf16) bf16-weights in one
    # process, bf16 under torchrun, else fp32: faster, with the same val BLEU at equal
    # updates (benchmarks/RESULTS.md); a resumed run keeps what auto gave it
    precision: Literal["auto", "fp32", "bf16", "fp16", "bf16-weights"] = "auto"
    target_seq_accuracy: float = 0.0  # stop once validation exact match reaches this (0 = off)
    valid_beam: int = 1  # translation: beam for the validation BLEU (1 = greedy, the fastest)
    tensorboard: bool = True  # also log metrics to run_dir/tensorboard (needs tensorboard)
    # torch.compile the model's forward for training (training/compiling.py): false, or a mode of
    # torch.compile; reduce-overhead (CUDA graphs) is refused on a CPU. Not in the checkpoints
    compile: bool | Literal["default", "reduce-overhead", "max-autotune"] = False

    def _check(self) -> None:
        _positive(
            self,
            "warmup",
            "max_tokens",
            "update_freq",
            "max_len",
            "max_steps",
            "keep_last",
            "log_every",
            "save_every",
            "valid_beam",
            "max_bad_updates",
        )
        _not_negative(
            self,
            "max_epochs",
            "max_minutes",
            "eval_every",
            "patience",
            "average_last",
            "clip_norm",
            "weight_decay",
        )
        _fraction(self, "label_smoothing", "adam_beta1", "adam_beta2")
        _positive(self, "lr_factor", "adam_eps")  # 0 learns nothing; below it, ascent
        if not 0 <= self.seed < 2**32:  # what every generator the run seeds takes
            raise UserError(f"seed must be in [0, 2**32); got {self.seed}")
        if self.eval_every == 0 and (self.patience or self.target_seq_accuracy):
            key = "patience" if self.patience else "target_seq_accuracy"
            raise UserError(
                f"{key} stops a run at a validation during it; eval_every 0 validates only at "
                f"the end: set eval_every, or {key} 0"
            )
        if not 0.0 <= self.target_seq_accuracy <= 1.0:
            raise UserError(
                f"target_seq_accuracy must be in [0, 1] (0: off); got {self.target_seq_accuracy}"
            )
        if self.pad_multiple != "auto":
            _positive(self, "pad_multiple")
            if self.pad_multiple > self.max_len:  # every batch padded past the longest pair
                raise UserError(
                    f"pad_multiple must be at most max_len ({self.max_len}); got "
                    f"{self.pad_multiple}"
                )
        if self.compile is True:  # one spelling per choice: a mode, or false
            raise UserError(
                "compile must be false or one of default, reduce-overhead, max-autotune; got true"
            )
        if not 0.0 <= self.cooldown <= 1.0:
            raise UserError(f"cooldown must be in [0, 1]; got {self.cooldown}")
        if self.average_last > self.keep_last:
            raise UserError(
                f"average_last ({self.average_last}) exceeds keep_last ({self.keep_last})"
            )


# The keys of SyntheticTaskConfig that each of its tasks does not read
SYNTHETIC_UNREAD: dict[str, tuple[str, ...]] = {
    "addition": ("min_length", "max_length", "n_symbols"),
    "copy": ("min_digits", "max_digits"),
    "reverse": ("min_digits", "max_digits"),
}


@dataclass(frozen=True)
class SyntheticTaskConfig(_Section):
    """A task generated in code: ``copy`` or ``reverse`` a symbol sequence, or ``addition`` of
    integers written as digits."""

    section: ClassVar[str] = "task"
    name: Literal["copy", "reverse", "addition"] = "addition"
    train_size: int = 50_000
    valid_size: int = 1_000
    min_digits: int = 1  # addition: operand lengths
    max_digits: int = 3
    reverse_input: bool = False  # feed the source sequence reversed
    min_length: int = 1  # copy / reverse: sequence lengths
    max_length: int = 10
    n_symbols: int = 10  # copy / reverse: alphabet size
    data_seed: int = 1234

    def _check(self) -> None:
        _positive(self, "train_size", "valid_size", "n_symbols", "min_digits", "min_length")
        defaults = {f.name: f.default for f in fields(self)}
        for key in SYNTHETIC_UNREAD[self.name]:
            if getattr(self, key) != defaults[key]:
                raise UserError(
                    f"task.{key} is not read by task {self.name} (it is for "
                    f"{'addition' if 'digits' in key else 'copy and reverse'})"
                )
        if self.max_digits < self.min_digits:
            raise UserError(
                f"max_digits ({self.max_digits}) is below min_digits ({self.min_digits})"
            )
        if self.max_length < self.min_length:
            raise UserError(
                f"max_length ({self.max_length}) is below min_length ({self.min_length})"
            )


@dataclass(frozen=True)
class TranslationTaskConfig(_Section):
    """``translation`` between sentence-aligned text files.

    File paths may hold environment variables (``${TRANSDUCE_DATA}/...``), expanded when training
    starts; relative paths are relative to the current directory. Files may be gzip-compressed
    (``.gz``).
    """

    section: ClassVar[str] = "task"
    name: Literal["translation"] = "translation"
    train_src: str = ""  # training source file, one sentence per line
    train_tgt: str = ""  # its line-aligned target file
    valid_src: str = ""  # validation files (loss, BLEU, best.pt); optional
    valid_tgt: str = ""
    vocab_size: int = 8000  # SentencePiece BPE pieces (of each vocabulary when not shared)
    # learn the vocabulary on this many sentences (0 = all; `transduce prepare`: 1,000,000)
    vocab_sample: int = 0
    # one vocabulary learned on both sides (the paper's), or one per side, the target embedding
    # then tied to the output layer alone
    shared_vocab: bool = True
    # BPE-dropout (Provilkov et al., 2020; not in the paper) on both sides of the training text,
    # a new segmentation every epoch; 0 = the one deterministic segmentation. On Multi30k in a
    # one-hour CPU budget it learned far slower (benchmarks/RESULTS.md)
    bpe_dropout: float = 0.0
    max_valid_sentences: int = 0  # validate on the first N pairs only (0 = all)
    # a folder written by `transduce prepare`: train from its memory-mapped ids and vocabulary;
    # the file, vocabulary and cleaning keys must then be unset or what it was prepared with
    prepared: str = ""
    # reuse a SentencePiece vocabulary instead of learning one: a .model file (shared), or a
    # folder holding vocab.model, or vocab.src.model and vocab.tgt.model (shared_vocab false)
    vocab_model: str = ""
    # cleaning of the training pairs, by `prepare` or training from the files (as prepare does;
    # pairs with an empty side are always dropped; validation is never cleaned):
    clean_max_len: int = 0  # drop pairs with a side of more than N subword pieces (0 = keep)
    clean_ratio: float = 0.0  # drop pairs whose longer side has over N x the pieces (Moses' -ratio)
    clean_identical: bool = False  # drop pairs whose source equals their target
    clean_dedup: bool = False  # drop exact repeats of a pair (the first is kept)

    def _check(self) -> None:
        _positive(self, "vocab_size")
        _not_negative(self, "vocab_sample", "max_valid_sentences", "clean_max_len")
        _fraction(self, "bpe_dropout")
        if self.clean_ratio and self.clean_ratio < 1.0:
            raise UserError(f"clean_ratio must be 0 (off) or at least 1; got {self.clean_ratio}")
        if 0 < self.vocab_sample <= 100:  # SentencePiece's own bound (input_sentence_size)
            raise UserError(
                f"vocab_sample must be 0 (every sentence) or more than 100 (SentencePiece "
                f"samples no fewer); got {self.vocab_sample}"
            )
        if self.vocab_model and self.vocab_sample:
            raise UserError(
                f"vocab_sample ({self.vocab_sample}) is the sample a vocabulary is learned on; "
                "with vocab_model none is learned: leave one of them out"
            )
        if bool(self.valid_src) != bool(self.valid_tgt):
            given, missing = (
                ("valid_src", "valid_tgt") if self.valid_src else ("valid_tgt", "valid_src")
            )
            raise UserError(
                f"{given} is set but {missing} is not; give both validation files or neither"
            )


@dataclass(frozen=True)
class ParsingTaskConfig(_Section):
    """``parsing``: English constituency parsing as translation (section 6.3): the words in, the
    tree out, linearised as in Vinyals et al. (2014) (``transduce.data.linearise``).

    ``parse_data`` names a folder of ``{train,dev}.words`` (one tokenised sentence a line) and
    ``{train,dev}.trees`` (one tree a line), as ``transduce data ptb-sample`` writes it; ``$VAR``s
    are expanded. The source is the words in SentencePiece BPE pieces, the target a closed set of
    bracket tokens: separate vocabularies, the target embedding tied to the output layer.
    """

    section: ClassVar[str] = "task"
    name: Literal["parsing"] = "parsing"
    parse_data: str = "data/ptb-sample"
    src_vocab_size: int = 4000  # BPE pieces of the source words
    keep_tags: bool = False  # part-of-speech tags as the word tokens instead of one XX
    # beyond the paper: each word slot is the word's first source piece (``▁Pierre``), not XX,
    # so the decoder can find its place in the sentence by content, as in translation
    slot_pieces: bool = False
    # beyond the paper: the search may only emit what can still become a well-formed tree with
    # the input's number of words (validation, parse and evaluate; they can override it)
    constrained: bool = False
    # beyond the paper: BPE-dropout (Provilkov et al., 2020) on the source words, each epoch's
    # segmentation drawn anew (the tree is the same whatever the pieces); 0 = off
    bpe_dropout: float = 0.0

    def _check(self) -> None:
        _positive(self, "src_vocab_size")
        _fraction(self, "bpe_dropout")
        if self.keep_tags and self.slot_pieces:
            raise UserError("keep_tags and slot_pieces both name the word slots: choose one")
        if self.bpe_dropout and self.slot_pieces:
            raise UserError(
                "slot_pieces spells each slot as the word's first piece, which "
                "bpe_dropout would change: choose one"
            )


TaskConfig = SyntheticTaskConfig | TranslationTaskConfig | ParsingTaskConfig


# task.name -> the dataclass of that task
_TASK_CLASSES = (SyntheticTaskConfig, TranslationTaskConfig, ParsingTaskConfig)


TASKS: dict[str, type[TaskConfig]] = {
    name: cls for cls in _TASK_CLASSES for name in get_args(_hints(cls)["name"])
}


MAX_ALPHA = 10.0  # the length penalty's alpha; ((5 + |Y|) / 6) ** alpha stays finite below it


MAX_LEN_OFFSET = 10_000  # output tokens beyond the source's: more is no translation


# a temperature near 0 overflows the division of the log-probabilities (inf, then NaN): greedy
# search is the limit that such a temperature means
MIN_TEMPERATURE, MAX_TEMPERATURE = 0.01, 100.0
# DecodeConfig's settings of sampling, which a search (sampling: false) has no use for
SAMPLING_KEYS = ("temperature", "top_k", "top_p", "sampling_seed")


@dataclass(frozen=True)
class DecodeConfig(_Section):
    """Inference settings (section 6.1: beam 4, alpha 0.6, max length input + 50)."""

    section: ClassVar[str] = "decode"
    beam: int = 4
    alpha: float = 0.6  # GNMT length penalty lp(Y) = ((5 + |Y|) / 6) ** alpha
    max_len_offset: int = 50
    decode_batch: int = 256  # sentences per decoding batch
    batch_tokens: int = 4000  # translation: padded source tokens per batch (sorted by length)
    # Sampling instead of search (transduce.inference.sampling): each next token drawn from the
    # model's distribution at ``temperature``, cut to the ``top_k`` most probable tokens (0: all)
    # and then to the smallest set holding ``top_p`` of the probability; ``sampling_seed`` seeds
    # each batch's draws (the same seed and batch give the same samples).
    sampling: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    sampling_seed: int = 0

    def _check(self) -> None:
        _positive(self, "beam", "decode_batch", "batch_tokens")
        _not_negative(self, "max_len_offset", "alpha")
        if self.max_len_offset > MAX_LEN_OFFSET:
            raise UserError(
                f"max_len_offset must be at most {MAX_LEN_OFFSET} (the paper's is 50); "
                f"got {self.max_len_offset}"
            )
        if self.alpha > MAX_ALPHA:
            raise UserError(
                f"alpha must be at most {MAX_ALPHA} (the paper's is 0.6); got {self.alpha}"
            )
        if not MIN_TEMPERATURE <= self.temperature <= MAX_TEMPERATURE:
            raise UserError(
                f"temperature must be between {MIN_TEMPERATURE} and {MAX_TEMPERATURE} (near 0, "
                f"greedy search is what it means); got {self.temperature}"
            )
        _not_negative(self, "top_k", "sampling_seed")
        if self.sampling_seed >= 2**63:  # torch.Generator's seed is a signed 64-bit integer
            raise UserError(f"sampling_seed must be below 2**63; got {self.sampling_seed}")
        if not 0.0 < self.top_p <= 1.0:
            raise UserError(f"top_p must be in (0, 1]; got {self.top_p}")
        if not self.sampling:  # a search would ignore them
            stray = [
                f.name
                for f in fields(self)
                if f.name in SAMPLING_KEYS and getattr(self, f.name) != f.default
            ]
            if stray:
                verb = "goes" if len(stray) == 1 else "go"
                them = "it" if len(stray) == 1 else "them"
                raise UserError(
                    f"{', '.join(stray)} {verb} with sampling: true; a search (sampling: false) "
                    f"ignores {them}"
                )

    def searching(self) -> DecodeConfig:
        """These settings as a search: sampling off, its settings back to their defaults."""
        defaults: dict[str, Any] = {
            f.name: f.default for f in fields(self) if f.name in SAMPLING_KEYS
        }
        return dataclasses.replace(self, sampling=False, **defaults)


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    task: TaskConfig = field(default_factory=SyntheticTaskConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    def __post_init__(self) -> None:
        for name, cls in (
            ("model", ModelConfig),
            ("train", TrainConfig),
            ("task", _TASK_CLASSES),
            ("decode", DecodeConfig),
        ):
            if not isinstance(getattr(self, name), cls):
                raise UserError(f"Config.{name} must be a {_type_names(cls)}")
        if self.model.position_unit == "word" and not isinstance(self.task, ParsingTaskConfig):
            raise UserError(
                "position_unit: word needs words in and word slots out: task.name: parsing"
            )
        self._check_validation_keys()

    def _check_validation_keys(self) -> None:
        """Validation settings that the task would ignore: refused, naming why."""
        t, task = self.train, self.task
        synthetic = isinstance(task, SyntheticTaskConfig)
        if t.target_seq_accuracy and not synthetic:
            raise UserError(
                "target_seq_accuracy is the exact match of a synthetic task's validation; "
                f"{task.name} validates by {'F1' if task.name == 'parsing' else 'BLEU'} "
                "(patience stops on it)"
            )
        if t.valid_beam != 1 and synthetic:
            raise UserError(
                "valid_beam is for translation's validation BLEU; a synthetic task's "
                "validation decodes greedily"
            )
        if (
            isinstance(task, TranslationTaskConfig)
            and not task.valid_src
            and not task.prepared
            and (t.patience or task.max_valid_sentences)
        ):
            key = "train.patience" if t.patience else "task.max_valid_sentences"
            raise UserError(f"{key} needs validation: set task.valid_src and task.valid_tgt")

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)


def _type_names(cls: type | tuple[type, ...]) -> str:
    return " or ".join(c.__name__ for c in (cls if isinstance(cls, tuple) else (cls,)))
