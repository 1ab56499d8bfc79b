"""The decoding toolbox on the command line: ``transduce score``, ``translate --sampling``,
``--prefix-file``, ensembles (``--model`` twice), ``--unbuffered``; on untrained tiny models
(checks of format, order and plumbing: what each computes is tested in tests/inference)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from transduce.cli.main import main
from transduce.inference.translator import Translator

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "inference"))
from inference_testkit import save_toy_translation_model, toy_sentences

SOURCES = ["the dog runs", "a cat", "", "the big red ball in the park"]
TARGETS = ["a cat", "", "the dog", "small"]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("toolbox")
    # the README's sentences in the vocabulary: its prefix "Ein Mann" is refused unless the
    # target side can write it
    readme = ["A man is riding a bike.", "Ein Mann fährt Fahrrad."] * 20
    paths = {
        "tf": save_toy_translation_model(d / "tf.pt", {"max_len_offset": 4}, text=readme),
        "rnn": save_toy_translation_model(
            d / "rnn.pt", {"max_len_offset": 4}, model={"architecture": "rnn"}, text=readme
        ),
    }
    (d / "src.txt").write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    (d / "tgt.txt").write_text("\n".join(TARGETS) + "\n", encoding="utf-8")
    paths.update(src=d / "src.txt", tgt=d / "tgt.txt", dir=d)
    return {k: str(v) for k, v in paths.items()}


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(["--no-malloc-tuning", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_score_writes_one_json_line_per_pair_in_order(files, capsys) -> None:
    code, out, _ = run(
        [
            "score",
            "--model",
            files["tf"],
            "--src",
            files["src"],
            "--tgt",
            files["tgt"],
            "--batch-tokens",
            "8",
        ],
        capsys,
    )
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    want = Translator.load(files["tf"]).score(SOURCES, TARGETS)
    assert [r["log_prob"] for r in rows] == pytest.approx([p.log_prob for p in want])
    assert [r["score"] for r in rows] == [r["log_prob"] for r in rows]
    assert set(rows[0]) == {"log_prob", "tokens", "per_token", "normalized", "score"}
    code, out, _ = run(
        [
            "score",
            "--model",
            files["tf"],
            "--src",
            files["src"],
            "--tgt",
            files["tgt"],
            "--normalize",
            "--alpha",
            "1.0",
        ],
        capsys,
    )
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["score"] for r in rows] == [r["normalized"] for r in rows]
    assert rows[1]["tokens"] == 1 and rows[1]["normalized"] == pytest.approx(rows[1]["log_prob"])
    assert rows[0]["normalized"] == pytest.approx(
        rows[0]["log_prob"] / ((5 + rows[0]["tokens"]) / 6)
    )


def test_ensembles_of_a_transformer_and_an_rnn(files, capsys) -> None:
    both = ["--model", files["tf"], "--model", files["rnn"]]
    code, out, _ = run(["score", *both, "--src", files["src"], "--tgt", files["tgt"]], capsys)
    assert code == 0
    mixed = [json.loads(line)["log_prob"] for line in out.splitlines()]
    alone = [Translator.load(files[k]).score(SOURCES, TARGETS) for k in ("tf", "rnn")]
    for i, (a, b) in enumerate(zip(*alone, strict=True)):
        # each step's mean probability is at least half of each member's
        assert mixed[i] >= max(a.log_prob, b.log_prob) - a.tokens * math.log(2) - 1e-4
        assert mixed[i] != pytest.approx(a.log_prob)
    code, out, _ = run(["translate", *both, "--input", files["src"], "--quiet"], capsys)
    assert code == 0 and len(out.splitlines()) == len(SOURCES)
    code, out, _ = run(
        ["evaluate", *both, "--src", files["src"], "--ref", files["tgt"], "--quiet", "--beam", "2"],
        capsys,
    )
    assert code == 0 and json.loads(out)["model"] == [files["tf"], files["rnn"]]


def test_an_ensemble_needs_one_vocabulary(files, tmp_path, capsys) -> None:
    from transduce import checkpoint
    from transduce.data.subword import train_sentencepiece

    other = tmp_path / "other.pt"
    ckpt = torch.load(files["tf"], weights_only=False)
    ckpt["vocab"] = train_sentencepiece(toy_sentences(300, seed=5), 60).to_dict()
    checkpoint.save(ckpt, other)
    code, _, err = run(
        ["translate", "--model", files["tf"], "--model", str(other), "--input", files["src"]],
        capsys,
    )
    assert code == 2 and "vocabulary" in err and len(err.strip().splitlines()) == 1


def test_sampling_is_reproducible_and_gives_k_samples(files, capsys) -> None:
    argv = [
        "translate",
        "--model",
        files["tf"],
        "--input",
        files["src"],
        "--quiet",
        "--sampling",
        "--seed",
        "3",
        "--nbest",
        "5",
        "--top-p",
        "0.9",
    ]
    code, first, _ = run(argv, capsys)
    assert code == 0
    lines = first.splitlines()
    assert [line.split("\t")[0] for line in lines] == ["0"] * 5 + ["1"] * 5 + ["2"] + ["3"] * 5
    assert run(argv, capsys)[1] == first
    argv[argv.index("3")] = "4"
    assert run(argv, capsys)[1] != first
    code, _, err = run(
        ["translate", "--model", files["tf"], "--input", files["src"], "--top-k", "3"], capsys
    )
    assert code == 2 and "--top-k goes with --sampling" in err
    code, _, err = run(
        ["translate", "--model", files["tf"], "--input", files["src"], "--sampling"], capsys
    )
    assert code == 2 and "--seed" in err
    sample = ["translate", "--model", files["tf"], "--input", files["src"], "--sampling"]
    code, _, err = run([*sample, "--seed", "1", "--beam", "3"], capsys)
    assert code == 2 and "--beam goes with search, not --sampling" in err
    code, out, _ = run([*sample, "--seed", "1", "--alpha", "1", "--nbest", "3"], capsys)
    assert code == 0  # alpha ranks the samples (their SCORE is over the length penalty)
    code, _, err = run(
        [
            "translate",
            "--model",
            files["tf"],
            "--input",
            files["src"],
            "--sampling",
            "--seed",
            "1",
            "--top-p",
            "0",
        ],
        capsys,
    )
    assert code == 2 and "--top-p" in err and "top_p" not in err  # the flag, not the key


def test_prefix_file(files, capsys) -> None:
    prefixes = Path(files["dir"]) / "prefixes.txt"
    prefixes.write_text("a cat\n\n\nsmall\n", encoding="utf-8")
    for beam in ("1", "3"):
        code, out, _ = run(
            [
                "translate",
                "--model",
                files["tf"],
                "--input",
                files["src"],
                "--prefix-file",
                str(prefixes),
                "--beam",
                beam,
                "--quiet",
            ],
            capsys,
        )
        assert code == 0
        lines = out.splitlines()
        assert lines[0].startswith("a cat") and lines[3].startswith("small"), lines
        assert lines[2] == ""  # an empty source line stays empty
    prefixes.write_text("\n" + "the dog " * 10 + "\n\n\n", encoding="utf-8")
    code, _, err = run(
        [
            "translate",
            "--model",
            files["tf"],
            "--input",
            files["src"],
            "--prefix-file",
            str(prefixes),
            "--max-len-offset",
            "1",
        ],
        capsys,
    )
    assert code == 2 and f"{prefixes}: line 2 has" in err and len(err.strip().splitlines()) == 1
    with_prefixes = ["translate", "--model", files["tf"], "--input", files["src"]]
    with_prefixes += ["--prefix-file", str(prefixes)]
    prefixes.write_text("a cat\n\nthe dog\nsmall\n", encoding="utf-8")  # line 3 of input: empty
    code, _, err = run(with_prefixes, capsys)
    assert code == 2 and f"{prefixes}: line 3: a prefix for an empty input line" in err
    prefixes.write_text("a cat\n", encoding="utf-8")
    code, _, err = run(with_prefixes, capsys)
    assert code == 2 and "1 prefixes for 4 input lines" in err


def test_unbuffered_answers_each_line_before_the_next(files) -> None:
    # stdout block-buffered, as a pipe's is by default: only the flush can answer in time
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [
        sys.executable,
        "-m",
        "transduce",
        "--no-malloc-tuning",
        "translate",
        "--model",
        files["tf"],
        "--unbuffered",
        "--beam",
        "2",
    ]
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None
    want = Translator.load(files["tf"]).translate(
        SOURCES, Translator.load(files["tf"]).decode_config(beam=2)
    )
    watchdog = threading.Timer(60, proc.kill)  # a missing answer fails the test, not hangs it
    watchdog.start()
    try:
        for sentence, expected in zip(SOURCES, want, strict=True):
            proc.stdin.write(sentence + "\n")
            proc.stdin.flush()
            assert proc.stdout.readline() == expected + "\n"  # before the next line is written
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
        watchdog.cancel()
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""


def test_line_by_line_by_default_on_a_terminal(monkeypatch) -> None:
    from argparse import Namespace

    from transduce.cli.decoding_tools import line_by_line
    from transduce.errors import UserError

    def args(**kw) -> Namespace:
        return Namespace(
            **{"input": None, "output": None, "interactive": None, "unbuffered": False, **kw}
        )

    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
    assert line_by_line(args()) and not line_by_line(args(interactive=False))
    assert not line_by_line(args(input="file.txt")) and not line_by_line(args(output="out.txt"))
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False, raising=False)
    assert not line_by_line(args()) and line_by_line(args(interactive=True))
    assert line_by_line(args(unbuffered=True))
    with pytest.raises(UserError, match="--input"):
        line_by_line(args(input="file.txt", unbuffered=True))
    with pytest.raises(UserError, match="--output"):
        line_by_line(args(output="out.txt", interactive=True))
    for kw in ({"unbuffered": True}, {"input": "file.txt"}, {"output": "out.txt"}):
        with pytest.raises(UserError, match="--no-interactive reads a whole stdin"):
            line_by_line(args(interactive=False, **kw))  # it would change nothing


@pytest.mark.parametrize("option", [["--batch-tokens", "7"], ["--quiet"]])
def test_options_of_a_whole_input_are_refused_line_by_line(files, capsys, option) -> None:
    code, _, err = run(["translate", "--model", files["tf"], "--unbuffered", *option], capsys)
    assert code == 2 and f"{option[0]} goes with a whole input, not line by line" in err


README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_decoding_tools_run_as_written(files, tmp_path, monkeypatch) -> None:
    """The README's "Decoding tools" commands and Python, run in a folder holding the files
    they name (the toy Transformer as runs/en_de, the toy rnn as runs/en_de_seed2)."""
    import re
    import shlex
    import shutil

    text = README.read_text(encoding="utf-8")
    start = text.index("#### Decoding tools")
    section = text[start : text.index("\n### ", start)]
    (bash,) = re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)
    (python,) = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    for run_dir, model in (("en_de", "tf"), ("en_de_seed2", "rnn")):
        (tmp_path / "runs" / run_dir).mkdir(parents=True)
        shutil.copy(files[model], tmp_path / "runs" / run_dir / "model.pt")
    for name, key in (("test.en", "src"), ("in.en", "src"), ("test.de", "tgt")):
        shutil.copy(files[key], tmp_path / name)
    # a prefix per input line, none for the empty one (a prefix there is refused)
    (tmp_path / "prefixes.de").write_text("a cat\n\n\nsmall\n", encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    transduce = f"{shlex.quote(sys.executable)} -m transduce --no-malloc-tuning"
    commands = [line for line in bash.splitlines() if line.startswith("transduce ")]
    assert len(commands) == 5
    for command in commands:
        shell = re.sub(r"^transduce", transduce, command)
        done = subprocess.run(
            ["bash", "-c", shell],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, (command, done.stderr)
        if "score" in command:
            rows = (tmp_path / "scores.jsonl").read_text(encoding="utf-8").splitlines()
            assert len(rows) == len(SOURCES) and "normalized" in json.loads(rows[0])
        elif "--nbest 4" in command:
            assert len(done.stdout.splitlines()) == 4 * 3 + 1  # an empty line: one
        else:
            assert len(done.stdout.splitlines()) == len(SOURCES), command
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(python, "README.md", "exec"), namespace)  # noqa: S102 (the README's own code)
    t = namespace["t"]
    assert len(t.score(["a"], ["b"])) == 1
    # (the toy vocabulary has no capitals: a prefix in its own words)
    assert t.translate(["a man"], prefixes=["the dog"])[0].startswith("the dog")
    assert len(t.translate_nbest(["the dog"], 4, namespace["sampling"])[0]) == 4


def test_answer_lines_flushes_each_answer_and_names_bad_input() -> None:
    import io

    from transduce.cli.decoding_tools import answer_lines
    from transduce.errors import UserError

    flushes: list[str] = []

    class Out(io.StringIO):
        def flush(self) -> None:
            flushes.append(self.getvalue())

    out = Out()
    answer_lines(lambda lines, i: [f"{i}:{lines[0]}"], io.StringIO("\ufeffa\n b \n"), out)
    assert flushes == ["0:a\n", "0:a\n1:b\n"]
    bad = io.TextIOWrapper(io.BufferedReader(io.BytesIO(b"ok\n\xff\n")), encoding="utf-8")
    with pytest.raises(UserError, match="line 2: invalid UTF-8"):
        answer_lines(lambda lines, i: lines, bad, io.StringIO())


def test_a_checkpoint_that_samples_takes_beam_and_the_sampling_flags(
    files, capsys, tmp_path
) -> None:
    from transduce import checkpoint

    sampler = tmp_path / "sampler.pt"
    ckpt = torch.load(files["tf"], weights_only=False)
    ckpt["config"]["decode"].update(sampling=True, sampling_seed=7, beam=2)
    checkpoint.save(ckpt, sampler)
    base = ["translate", "--input", files["src"], "--quiet"]
    searched = run([*base, "--model", files["tf"], "--beam", "1"], capsys)[1]
    assert run([*base, "--model", str(sampler), "--beam", "1"], capsys)[1] == searched
    sampled = run([*base, "--model", str(sampler)], capsys)[1]
    hotter = run([*base, "--model", str(sampler), "--temperature", "5"], capsys)[1]
    reseeded = run([*base, "--model", str(sampler), "--seed", "8", "--temperature", "5"], capsys)
    assert sampled != searched and hotter != sampled and reseeded[1] != hotter
    code, _, err = run([*base, "--model", str(sampler), "--beam", "2", "--top-k", "3"], capsys)
    assert code == 2 and "--top-k goes with --sampling (--beam asks for a search)" in err
    code, out, _ = run(
        ["evaluate", "--model", str(sampler), "--src", files["src"], "--ref", files["tgt"]], capsys
    )
    scores = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and "beam" not in scores and scores["sampling"]["seed"] == 7
    evaluate = ["evaluate", "--src", files["src"], "--ref", files["tgt"], "--beam", "1"]
    code, out, _ = run([*evaluate, "--model", str(sampler)], capsys)
    searched_scores = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and searched_scores["beam"] == 1 and "sampling" not in searched_scores
    plain = json.loads(run([*evaluate, "--model", files["tf"]], capsys)[1].strip().splitlines()[-1])
    assert searched_scores["bleu"] == plain["bleu"]  # the search, as the model's without sampling


def test_score_warns_of_text_the_model_reads_as_unknown(files, capsys, tmp_path) -> None:
    tgt = tmp_path / "odd.txt"
    tgt.write_text("a cat\n\nthe dog ✈\nsmall\n", encoding="utf-8")  # a piece it cannot write
    argv = ["score", "--model", files["tf"], "--src", files["src"], "--tgt"]
    code, out, err = run([*argv, str(tgt)], capsys)
    assert code == 0 and len(out.splitlines()) == 4
    assert f"warning: {tgt}: 1 target pieces not in the model's vocabulary" in err
    code, _, err = run([*argv, files["tgt"]], capsys)
    assert code == 0 and "warning" not in err
