"""`transduce import huggingface` and `transduce export huggingface`: the README's commands run
as shown on a Marian folder made here, and what they write is what the Python API writes;
refusals are one line with exit code 2."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

from marian_testkit import marian_folder  # noqa: E402

from transduce.cli.main import main  # noqa: E402
from transduce.inference.translator import Translator  # noqa: E402

README = Path(__file__).resolve().parents[2] / "README.md"


def _section() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("### Use it elsewhere")
    return text[start : text.index("#### LibreTranslate clients", start)]


def _run(argv: list[str], cwd: Path, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "transduce", "--no-malloc-tuning", *argv]
    return subprocess.run(cmd, cwd=cwd, input=stdin, capture_output=True, text=True, env=env)


def test_readme_commands_import_translate_export(tmp_path: Path) -> None:
    section = _section()
    (bash,) = re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)
    (python,) = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    commands = bash.strip().splitlines()
    folder = commands[0].split()[3]  # transduce import huggingface FOLDER --output FILE
    marian_folder(tmp_path / folder, eos_bias=6.0)  # outputs that end before any length limit
    outputs = []
    for line in commands:
        stdin = ""
        if "|" in line:  # echo "TEXT" | transduce ...
            echo, line = line.split("|")
            stdin = echo.strip().removeprefix("echo ").strip('"') + "\n"
        argv = line.split()
        assert argv[0] == "transduce"
        done = _run(argv[1:], tmp_path, stdin)
        assert done.returncode == 0, done.stderr
        if argv[1] == "export":  # a success says nothing on stderr (no tokenizer warning)
            assert "Warning" not in done.stderr, done.stderr
        outputs.append(done.stdout)
    summary = json.loads(outputs[0])
    model_file = tmp_path / commands[0].split("--output")[1].split()[0]
    assert model_file.is_file() and summary
    # translate printed what the Python API translates
    t = Translator.load(model_file)
    assert outputs[1].splitlines() == t.translate(["A dog runs on the beach."])
    # the README's Python, run in the folder: generate (greedy) says what translate --beam 1 says
    done = subprocess.run(
        [sys.executable, "-c", python],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr
    greedy = t.translate(["A dog runs on the beach."], t.decode_config(beam=1))
    assert done.stdout.strip() == repr(greedy)


def test_refusals_are_one_line_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    marian_folder(tmp_path / "opus")
    capsys.readouterr()  # save_pretrained's progress lines
    argv = ["--no-malloc-tuning", "import", "huggingface"]
    assert main([*argv, str(tmp_path / "missing"), "--output", str(tmp_path / "m.pt")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "missing" in err
    config = json.loads((tmp_path / "opus" / "config.json").read_text(encoding="utf-8"))
    config["normalize_before"] = True
    (tmp_path / "opus" / "config.json").write_text(json.dumps(config), encoding="utf-8")
    assert main([*argv, str(tmp_path / "opus"), "--output", str(tmp_path / "m.pt")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "normalize_before" in err
    assert not (tmp_path / "m.pt").exists()
    out = ["--no-malloc-tuning", "export", "huggingface", "--model", str(tmp_path / "no.pt")]
    assert main([*out, "--output", str(tmp_path / "hf")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
