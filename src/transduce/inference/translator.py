"""Raw text in, detokenized text out: ``Translator``, the Python API behind ``transduce translate``
and ``transduce evaluate``.

A checkpoint carries its configuration and its vocabulary (the SentencePiece model), so a model
file alone translates::

    from transduce import Translator
    t = Translator.load("runs/m30k/model.pt")
    t.translate(["A man is riding a bike.", ""])  # -> ["Ein Mann ...", ""]
    t.translate(["A man is riding a bike."], t.decode_config(beam=8, alpha=1.0))

Decoding settings travel as one ``DecodeConfig``: ``decode_config`` makes it from the
checkpoint's ``decode`` section with some settings replaced, and ``translate``,
``translate_nbest`` and ``inference.evaluation.evaluate_files`` take it (default: the checkpoint's).

How sentences are decoded:

* Each line is stripped; an empty line translates to ``""`` without running the model, so
  outputs stay line-aligned with inputs.
* Sentences are sorted by length and cut into batches of at most ``batch_tokens`` padded source
  tokens and ``decode_batch`` sentences (longest batch first, so an out-of-memory error shows at
  once, not at the end); outputs come back in input order. Padding is masked, so a sentence's
  translation does not depend on the batch it lands in (up to floating-point rounding):
  ``batch_tokens`` and ``decode_batch`` change speed, not output.
  With int8 weights too: each product quantises each input row with its own scale
  (``kernels.quantized``, whose two kernels give the same numbers bit for bit), so the other
  sentences of a batch do not move a sentence's rounding.
* Greedy search when ``beam`` is 1, else beam search with the GNMT length penalty ``alpha``
  (``transduce.inference.generate``). Outputs have at most (source tokens + 1 for its
  EOS + ``max_len_offset``) tokens.

The decoding toolbox: ``score`` gives the log-probabilities of given translations (forced
decoding, ``inference.scoring``); ``load_ensemble`` decodes several checkpoints as one
(``inference.ensemble``); ``translate(..., prefixes=...)`` forces each translation's start
(``inference.prefix``); ``DecodeConfig.sampling`` samples (``inference.sampling``).

"Weights" names the dtype a model decodes with (``inference.weights``: "fp32", "bf16", "fp16"
or "int8", the CLI's ``--precision``), apart from training's autocast ``train.precision``.
"fp16" is for CUDA GPUs (refused elsewhere); "int8" decodes a Transformer on the CPU with its
inference engine's projections in int8 (``DecodingModel``'s ``int8``) and everything else in
float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from copy import deepcopy
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from transduce import kernels
from transduce.architectures import Seq2Seq
from transduce.checkpoint import load_model
from transduce.config import Config, DecodeConfig
from transduce.console import PeriodicLines, is_terminal
from transduce.data.batching import collate
from transduce.data.vocab import UNK, Vocab
from transduce.device import resolve_device
from transduce.errors import SentenceError, UserError
from transduce.inference.attention_maps import attention_maps, pharaoh, sides, word_alignment
from transduce.inference.common import MAX_SENTENCE_TOKENS
from transduce.inference.contract import DecodableModel
from transduce.inference.ensemble import Ensemble
from transduce.inference.prefix import PrefixConstrained
from transduce.inference.scoring import PairScore, score_targets
from transduce.inference.search import generate, graphs_apply, searchable
from transduce.inference.text_inputs import as_read, check_lengths, length_batches, text_list
from transduce.inference.weights import (
    WeightPrecision,
    check_device,
    check_int8,
    weight_dtype,
)
from transduce.model.transformer import Transformer

__all__ = [
    "MAX_SAMPLES",
    "MAX_SENTENCE_TOKENS",
    "Translation",
    "Translator",
    "length_batches",
    "resolve_device",
]

# The most samples of one sentence ``translate_nbest`` draws (they decode as one batch's rows)
MAX_SAMPLES = 1000


@dataclass(frozen=True)
class Translation:
    """One hypothesis: detokenized ``text``; ``score`` = ``log_prob / lp(|Y|)`` (what the beam
    ranks by, ``alpha`` included); ``log_prob`` = sum of token log-probabilities, EOS included."""

    text: str
    score: float
    log_prob: float


def _max_positions(cfg: Config) -> int | None:
    """The positions a model of ``cfg`` can place: its learned table's size, or None (the
    sinusoidal table grows)."""
    return cfg.model.max_positions if cfg.model.positional == "learned" else None


def _check_graphs(graphs: bool | None, device: torch.device) -> None:
    """A UserError when decoding on CUDA graphs is asked for off a CUDA device."""
    if graphs and not kernels.graphs_capture(device):
        raise UserError(f"decoding on CUDA graphs needs a CUDA device, not {device}")


def _task_name(task: Any) -> str:
    """A task's name, and "input reversed" where the model reads its sources reversed."""
    return task.name + (", input reversed" if getattr(task, "reverse_input", False) else "")


class Translator:
    """A trained model with its vocabulary and decoding defaults (the checkpoint's ``decode``
    section: beam 4, alpha 0.6 unless the run's config said otherwise).

    Searches run on a ``DecodingModel`` made here: a snapshot of the model's weights laid out
    for encoding and step-by-step decoding; made by ``load``, ``of_model`` or
    ``load_ensemble`` on a CUDA GPU, its steps replayed as CUDA graphs (their ``graphs``), made
    directly (``Translator(model, vocab, cfg)``, as training's validation does) step by step.
    Make a new Translator after changing the weights."""

    def __init__(
        self,
        model: Seq2Seq,
        vocab: Vocab,
        cfg: Config,
        decoding: DecodableModel[Any] | None = None,
    ) -> None:
        """``decoding``: what the searches run (default: ``searchable(model)``), e.g. a
        constrained wrapper of it."""
        self.model = model
        self.vocab = vocab
        self.cfg = cfg
        self.decoding = searchable(model) if decoding is None else decoding
        # the fewest positions a model of the search can place (learned positions; None: no
        # limit): an ensemble's is its members' least (load_ensemble)
        self.max_positions = _max_positions(cfg)

    @classmethod
    def load(
        cls,
        path: str | Path,
        device: str | torch.device = "cpu",
        weights: WeightPrecision = "fp32",
        *,
        graphs: bool | None = None,
    ) -> Translator:
        """From a checkpoint file (``model.pt``, ``best.pt``, an average) or a run folder (its
        ``model.pt``). A missing or unreadable file is a UserError naming it. ``graphs``: see
        ``of_model``.

        ``weights`` "bf16" converts the weights to bfloat16 (half the memory traffic; on CPUs
        with bfloat16 instructions and on GPUs, faster), which can change a translation where
        two candidates are nearly tied; "fp16" converts them to float16 (CUDA GPUs only: a
        UserError elsewhere); "int8" quantises the projections (``of_model``);
        "fp32" (the default) decodes as trained."""
        weight_dtype(weights)  # the name and the device checked before the file is read
        dev = resolve_device(device)
        if weights != "int8" or dev.type != "cpu":  # int8 on a CPU: the model's kind first
            check_device(weights, dev)
        _check_graphs(graphs, dev)
        model, vocab, cfg = load_model(path, device=dev)
        if weights == "int8":
            check_int8(model, str(path))
        return cls._of_model(model, vocab, cfg, weights, graphs, copy=False)  # its own model

    @classmethod
    def of_model(
        cls,
        model: Seq2Seq,
        vocab: Vocab,
        cfg: Config,
        weights: WeightPrecision = "fp32",
        *,
        graphs: bool | None = None,
    ) -> Translator:
        """A Translator of ``model`` decoding with ``weights`` (see ``load``): the model
        converted to their dtype; for "int8", its engine made with int8 projections (per
        output channel, measured faster on CPUs with int8 dot products and as good in BLEU:
        README) after ``check_int8``. ``graphs``: the engine's steps replayed as CUDA graphs
        (``searchable``): True asks for them (a Transformer on a CUDA GPU, else a UserError),
        False for the engine step by step, None (the default) takes them wherever they apply
        (``graphs_apply``: measured faster there, benchmarks/RESULTS.md). A ``model`` of another
        dtype than ``weights``' is converted as a copy: the caller's keeps its weights. Decoding
        puts the model in eval mode."""
        return cls._of_model(model, vocab, cfg, weights, graphs, copy=True)

    @classmethod
    def _of_model(
        cls,
        model: Seq2Seq,
        vocab: Vocab,
        cfg: Config,
        weights: WeightPrecision,
        graphs: bool | None,
        *,
        copy: bool,
    ) -> Translator:
        """``of_model``; ``copy``: convert a copy of ``model`` (False: ``model`` itself)."""
        dtype = weight_dtype(weights)
        device = next(model.parameters()).device
        if weights == "int8":
            check_int8(model)  # its kind first, then the device
        else:
            check_device(weights, device)
        _check_graphs(graphs, device)  # before the model is converted
        if copy and next(model.parameters()).dtype != dtype:  # .to converts a module in place
            model = deepcopy(model)
        model = model.to(dtype)
        if graphs is None:  # where they apply; int8 is the CPU's
            graphs = weights != "int8" and graphs_apply(model)
        try:
            decoding = searchable(model, int8=weights == "int8", graphs=graphs)
        except ValueError as e:
            raise UserError(str(e)) from None
        return cls(model, vocab, cfg, decoding)

    @classmethod
    def load_ensemble(
        cls,
        paths: Sequence[str | Path],
        device: str | torch.device = "cpu",
        weights: WeightPrecision = "fp32",
        *,
        graphs: bool | None = None,
    ) -> Translator:
        """Several checkpoints decoded as one model, the mean of their next-token probabilities
        (``inference.ensemble``); one path loads as ``load``. The models must share a
        vocabulary (else a UserError); the first one's configuration and decoding defaults
        are the Translator's (and its model the one ``align`` reads)."""
        if isinstance(paths, (str, Path)):  # a str is a Sequence of characters
            raise UserError(f"an ensemble takes a list of one or more checkpoints, not {paths!r}")
        paths = list(paths)
        if not paths:
            raise UserError("an ensemble takes a list of one or more checkpoints, not none")
        if len(paths) == 1:
            return cls.load(paths[0], device, weights, graphs=graphs)
        members = [cls.load(path, device, weights, graphs=graphs) for path in paths]
        first = members[0]
        for path, member in zip(paths[1:], members[1:], strict=True):
            if member.vocab.to_dict() != first.vocab.to_dict():
                raise UserError(
                    f"{path}: its vocabulary is not that of {paths[0]}; an ensemble's models "
                    "must share one"
                )
            task, first_task = member.cfg.task, first.cfg.task
            if task.name != first_task.name or as_read("ab", task) != as_read("ab", first_task):
                raise UserError(  # one source text is read once for every member
                    f"{path}: its task ({_task_name(task)}) is not that of {paths[0]} "
                    f"({_task_name(first_task)}); an ensemble's models must share one"
                )
        ensemble = cls(first.model, first.vocab, first.cfg, Ensemble([m.decoding for m in members]))
        limits = [m.max_positions for m in members if m.max_positions is not None]
        ensemble.max_positions = min(limits) if limits else None
        return ensemble

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def decode_config(
        self,
        *,
        beam: int | None = None,
        alpha: float | None = None,
        batch_tokens: int | None = None,
        max_len_offset: int | None = None,
    ) -> DecodeConfig:
        """The model's decoding settings (the checkpoint's ``decode`` section) with the given
        ones replaced (None keeps one), checked: what ``translate`` takes. Where a user's
        settings meet the model's defaults (the CLI, the server, the Python API). A ``beam``
        asks for a search: a model whose settings sample searches with it (``searching``)."""
        changes: dict[str, Any] = {
            key: value
            for key, value in {
                "beam": beam,
                "alpha": alpha,
                "batch_tokens": batch_tokens,
                "max_len_offset": max_len_offset,
            }.items()
            if value is not None
        }
        base = self.cfg.decode if beam is None else self.cfg.decode.searching()
        return self._fits(replace(base, **changes))  # types and ranges checked

    def _given(self, decode: DecodeConfig | None) -> DecodeConfig:
        """``decode`` (None: the model's), a TypeError if it is not a DecodeConfig."""
        if decode is not None and not isinstance(decode, DecodeConfig):
            raise TypeError(
                f"decode must be a DecodeConfig (see Translator.decode_config), not "
                f"{type(decode).__name__}"
            )
        return self.cfg.decode if decode is None else decode

    def _fits(self, decode: DecodeConfig | None) -> DecodeConfig:
        """``decode`` (None: the model's), refused if its search's beam exceeds the vocabulary
        (sampling has no beam)."""
        cfg = self._given(decode)
        if not cfg.sampling and cfg.beam > len(self.vocab):  # hypotheses > tokens to extend them
            raise UserError(
                f"beam ({cfg.beam}) must not exceed the vocabulary size ({len(self.vocab)})"
            )
        return cfg

    def translate(
        self,
        sentences: Sequence[str],
        decode: DecodeConfig | None = None,
        *,
        show_progress: bool | None = False,
        prefixes: Sequence[str] | None = None,
    ) -> list[str]:
        """One detokenized translation per sentence, in order (``""`` for an empty one), decoded
        with ``decode`` (default: the model's settings; see ``decode_config``). ``prefixes``:
        one per sentence, the text each translation must start with ("" for none;
        ``inference.prefix``)."""
        cfg = self._fits(decode)
        hyps = self._decode(sentences, cfg, 1, show_progress, prefixes)
        return [h[0].text for h in hyps]

    def translate_nbest(
        self,
        sentences: Sequence[str],
        nbest: int,
        decode: DecodeConfig | None = None,
        *,
        show_progress: bool | None = False,
        prefixes: Sequence[str] | None = None,
    ) -> list[list[Translation]]:
        """For each sentence its ``nbest`` best translations, best first (fewer when the beam
        finds fewer distinct ones). ``nbest`` must not exceed the beam. An empty sentence gets
        the single translation ``""`` with score and log-probability 0. With ``decode.sampling``
        the ``nbest`` are samples (best score first, not necessarily distinct), any number."""
        cfg = self._fits(decode)
        if isinstance(nbest, bool) or not isinstance(nbest, int):
            raise TypeError(f"nbest must be an integer; got {nbest!r}")
        if nbest < 1:
            raise UserError(f"nbest must be at least 1; got {nbest}")
        if nbest > cfg.beam and not cfg.sampling:
            raise UserError(f"nbest ({nbest}) must not exceed the beam size ({cfg.beam})")
        if nbest > MAX_SAMPLES:  # K rows a sentence at once: 100,000 of a toy model took 3 GB
            raise UserError(
                f"nbest ({nbest}): at most {MAX_SAMPLES} samples a sentence are drawn at once; "
                "draw more in several runs with other seeds"
            )
        return self._decode(sentences, cfg, nbest, show_progress, prefixes)

    def _decode(
        self,
        sentences: Sequence[str],
        cfg: DecodeConfig,
        nbest: int,
        show_progress: bool | None,
        prefixes: Sequence[str] | None = None,
    ) -> list[list[Translation]]:
        texts = [s.strip() for s in text_list(sentences, "sentence")]
        if prefixes is not None:
            prefixes = text_list(prefixes, "prefix", "prefixes")
            if len(prefixes) != len(texts):
                raise UserError(f"{len(prefixes)} prefixes for {len(texts)} sentences")
        out: list[list[Translation]] = [[Translation("", 0.0, 0.0)] for _ in texts]
        todo = [i for i, t in enumerate(texts) if t]
        read = [as_read(texts[i], self.cfg.task) for i in todo]
        encode_batch = getattr(self.vocab, "encode_batch", None)
        ids = encode_batch(read) if encode_batch is not None else list(map(self.vocab.encode, read))
        # a line of no tokens (empty, or what the tokenizer drops: U+200B) is answered empty
        todo, ids = [i for i, x in zip(todo, ids, strict=True) if x], [x for x in ids if x]
        decoded = set(todo)
        for i, prefix in enumerate(prefixes or []):
            if prefix.strip() and i not in decoded:  # answered empty: the prefix would be lost
                raise SentenceError(
                    i + 1, f": a prefix for an empty input line ({prefix.strip()!r})", "prefix"
                )
        check_lengths(ids, todo, self.max_positions, cfg.max_len_offset)
        forced = None if prefixes is None else self._prefix_ids(prefixes, ids, todo, cfg)
        self.model.eval()
        device = self.device
        # +1: the EOS every source gets (collate), as in training; at most decode_batch sentences
        batches = [
            batch[k : k + cfg.decode_batch]
            for batch in length_batches([len(x) + 1 for x in ids], cfg.batch_tokens)
            for k in range(0, len(batch), cfg.decode_batch)
        ]
        # without a terminal (tqdm then shows nothing): a plain line every 30 s of long work
        lines = (
            PeriodicLines("translate", len(todo), unit="sentences")
            if show_progress is not False and not is_terminal()
            else None
        )
        with tqdm(
            total=len(todo),
            unit="sent",
            desc="translate",
            disable=show_progress is False or None,
            leave=False,
        ) as bar:
            for batch in batches:
                src = collate([(ids[j], []) for j in batch]).src.to(device)
                step_cfg = replace(cfg, decode_batch=len(batch))  # one generate call per batch
                decoding = self.decoding
                if forced is not None:  # a wrapper for this batch's prefixes
                    decoding = PrefixConstrained(decoding, [forced[j] for j in batch])
                hyps_of_batch = generate(decoding, src, step_cfg, nbest)
                for j, hyps in zip(batch, hyps_of_batch, strict=True):
                    if not hyps:  # a constraint (a parser's trees) no output within the cap met
                        raise SentenceError(
                            todo[j] + 1,
                            ": no output meets the search's constraint within the output limit "
                            f"(its tokens + EOS + max_len_offset {cfg.max_len_offset}): raise "
                            "max_len_offset",
                        )
                    out[todo[j]] = [
                        Translation(self.vocab.decode(h.tokens), h.score, h.log_prob) for h in hyps
                    ]
                bar.update(len(batch))
                if lines is not None:
                    lines.update(len(batch))
        if lines is not None:
            lines.close()
        return out

    def _prefix_ids(
        self,
        prefixes: Sequence[str],
        ids: Sequence[list[int]],
        todo: Sequence[int],
        cfg: DecodeConfig,
    ) -> list[list[int]]:
        """The token ids of the prefixes of the sentences ``todo``; a UserError naming the first
        one longer than its output may be (source tokens + EOS + ``max_len_offset``)."""
        out, target = [], sides(self.vocab)[1]  # a prefix is the target side's text
        for j, i in enumerate(todo):
            prefix = target.encode(prefixes[i].strip()) if prefixes[i].strip() else []
            if UNK in prefix:  # forced, it would not be the text asked for
                raise SentenceError(
                    i + 1,
                    f" ({prefixes[i].strip()!r}) holds what the model's target vocabulary cannot "
                    "write (read as <unk>)",
                    "prefix",
                )
            if len(prefix) > len(ids[j]) + 1 + cfg.max_len_offset:
                raise SentenceError(
                    i + 1,
                    f" has {len(prefix)} subword tokens; the output of its sentence may have at "
                    f"most {len(ids[j]) + 1 + cfg.max_len_offset}",
                    "prefix",
                )
            out.append(prefix)
        return out

    def score(
        self, sources: Sequence[str], targets: Sequence[str], decode: DecodeConfig | None = None
    ) -> list[PairScore]:
        """Forced decoding: for each (source, target) pair, in order, the log-probability the
        model gives the target (``inference.scoring.PairScore``: summed, per token and over
        the length penalty of ``decode.alpha``, the beam's ``score`` of that output), batched
        by ``decode.batch_tokens``. Empty lines are scored too (an empty target is EOS alone)."""
        cfg = self._given(decode)  # (its alpha and batch_tokens: no search, no beam)
        sources, targets = text_list(sources, "source"), text_list(targets, "target")
        if len(sources) != len(targets):
            raise UserError(f"{len(sources)} sources but {len(targets)} targets")
        src_ids = [self.vocab.encode(as_read(s.strip(), self.cfg.task)) for s in sources]
        target = sides(self.vocab)[1]  # a target is the target side's text
        tgt_ids = [target.encode(t.strip()) for t in targets]
        everything = list(range(len(sources)))
        # a source's n tokens + EOS, a target's BOS + m tokens: m + 1 positions each
        check_lengths(src_ids, everything, self.max_positions, None)
        check_lengths(tgt_ids, everything, self.max_positions, None, "target")
        self.model.eval()
        out: list[PairScore | None] = [None] * len(sources)
        lengths = [max(len(s), len(t)) + 1 for s, t in zip(src_ids, tgt_ids, strict=True)]
        for batch in length_batches(lengths, cfg.batch_tokens):
            src = collate([(src_ids[j], []) for j in batch]).src.to(self.device)
            scores = score_targets(self.decoding, src, [tgt_ids[j] for j in batch], cfg.alpha)
            for j, pair in zip(batch, scores, strict=True):
                out[j] = pair
        return [pair for pair in out if pair is not None]

    def check_alignment(self, layer: int = -1) -> None:
        """A UserError where ``align(..., layer=layer)`` would be refused: an ensemble, the
        recurrent model, a layer this model lacks (so a caller can refuse before decoding)."""
        if isinstance(self.decoding, Ensemble):  # self.model is only its first member
            raise UserError(
                "alignments read one model's attention; an ensemble's members attend "
                "differently: align with one member's Translator"
            )
        if not isinstance(self.model, Transformer):
            raise UserError("alignments come from a Transformer's attention, not the rnn's")
        n_layers = self.cfg.model.n_layers
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise TypeError(f"layer must be an int; got {layer!r}")
        if not -n_layers <= layer < n_layers:
            raise UserError(f"alignment layer {layer}: this model has layers 0 to {n_layers - 1}")

    def align(
        self, sentences: Sequence[str], translations: Sequence[str], *, layer: int = -1
    ) -> list[str]:
        """For each pair, the Pharaoh word alignment (``i-j``: source word i, target word j) of
        the model's encoder-decoder attention in ``layer`` (default: the last), averaged over its
        heads (``inference.attention_maps.word_alignment``); "" where either side is empty."""
        self.check_alignment(layer)
        sentences = text_list(sentences, "sentence")
        translations = text_list(translations, "translation")
        if len(sentences) != len(translations):
            raise UserError(f"{len(sentences)} sentences but {len(translations)} translations")
        out = []
        for source, target in zip(sentences, translations, strict=True):
            if not source.strip() or not target.strip():
                out.append("")
                continue
            maps = attention_maps(self.model, self.vocab, as_read(source, self.cfg.task), target)
            out.append(pharaoh(word_alignment(maps, self.vocab, layer)))
        return out
