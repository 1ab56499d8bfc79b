"""Subcommands that move models between transduce and other tools: ``export ctranslate2``,
``export huggingface`` and ``import huggingface``.

``transduce export ctranslate2 --model CKPT --output DIR`` writes a CTranslate2 model folder
(``transduce.export.ctranslate2``; needs ``pip install 'transduce[export]'``).
``transduce export huggingface --model CKPT --output DIR`` writes a Hugging Face Marian folder
that ``MarianMTModel.from_pretrained`` and ``AutoTokenizer.from_pretrained`` load, and
``transduce import huggingface DIR --output MODEL.pt`` reads one (an OPUS-MT model, say) into an
ordinary transduce model file (``transduce.export.huggingface``; needs ``pip install
'transduce[hf]'``). Each prints one JSON line describing what it wrote.
"""

from __future__ import annotations

import argparse
import json

from transduce.cli.common import Once, refuse_stdout, require


def _cmd_export_ctranslate2(args: argparse.Namespace) -> int:
    require(("ctranslate2",), "export", "transduce export ctranslate2")
    from transduce.export.ctranslate2 import export_checkpoint

    refuse_stdout(args.output, "--output", "model folder")
    quantization = None if args.quantization == "none" else args.quantization
    info = export_checkpoint(args.model, args.output, quantization=quantization, force=args.force)
    print(json.dumps(info), flush=True)
    return 0


def _cmd_export_huggingface(args: argparse.Namespace) -> int:
    require(("transformers",), "hf", "transduce export huggingface")
    from transduce.export.huggingface import export_marian

    refuse_stdout(args.output, "--output", "model folder")
    print(json.dumps(export_marian(args.model, args.output, force=args.force)), flush=True)
    return 0


def _cmd_import_huggingface(args: argparse.Namespace) -> int:
    require(("transformers",), "hf", "transduce import huggingface")
    from transduce.export.huggingface import import_marian

    refuse_stdout(args.output, "--output", "model file")
    print(json.dumps(import_marian(args.folder, args.output, force=args.force)), flush=True)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="export a model for other inference engines")
    export_sub = p.add_subparsers(dest="export_format", required=True, metavar="FORMAT")
    c = export_sub.add_parser(
        "ctranslate2",
        help="a CTranslate2 model folder (model.bin, config.json, vocabulary, sentencepiece.model)",
        description="Convert a checkpoint to a CTranslate2 Transformer model folder, with the "
        "SentencePiece model beside it. Translate with ctranslate2.Translator(DIR) on the "
        "SentencePiece pieces of each sentence.",
    )
    c.add_argument("--model", required=True, action=Once, help="checkpoint file or run folder")
    c.add_argument("--output", required=True, help="folder to write (new unless --force)")
    c.add_argument(
        "--quantization",
        default="none",
        choices=[
            "none",
            "int8",
            "int8_float32",
            "int8_float16",
            "int8_bfloat16",
            "int16",
            "float16",
            "bfloat16",
            "float32",
        ],
        help="weight type in the exported model (default: none = as trained, float32)",
    )
    c.add_argument("--force", action="store_true", help="replace --output if it exists")
    c.set_defaults(func=_cmd_export_ctranslate2)
    h = export_sub.add_parser(
        "huggingface",
        help="a Hugging Face Marian folder (config.json, weights, source.spm, target.spm, "
        "vocab.json, generation_config.json)",
        description="Convert a Transformer model file to the folder MarianMTModel.from_pretrained "
        "and AutoTokenizer.from_pretrained load (offline); generation_config.json carries the "
        "model's beam and length penalty. A model Marian cannot represent (the recurrent "
        "baseline, pre-norm, learned or word positions) is refused.",
    )
    h.add_argument("--model", required=True, action=Once, help="transduce model file")
    h.add_argument("--output", required=True, help="folder to write (new unless --force)")
    h.add_argument("--force", action="store_true", help="replace a previous export at --output")
    h.set_defaults(func=_cmd_export_huggingface)

    p = sub.add_parser("import", help="import a model made by another tool")
    import_sub = p.add_subparsers(dest="import_format", required=True, metavar="FORMAT")
    i = import_sub.add_parser(
        "huggingface",
        help="a Hugging Face Marian folder (an OPUS-MT model) as a transduce model file",
        description="Read a local Marian folder (what MarianMTModel.save_pretrained and "
        "MarianTokenizer.save_pretrained write, as the OPUS-MT models on the Hugging Face hub "
        "are laid out) into a transduce model file that translate, evaluate, serve, attention "
        "and export take. Nothing is downloaded: fetch the folder first.",
    )
    i.add_argument("folder", help="the Marian model folder")
    i.add_argument(
        "--output",
        required=True,
        help="the transduce model file to write (new unless --force; .safetensors: that format)",
    )
    i.add_argument("--force", action="store_true", help="replace an existing --output file")
    i.set_defaults(func=_cmd_import_huggingface)
