"""The README's one-GPU block as written: the GPU recipe's train and evaluate commands parse and
make the config the README describes, and benchmarks/gpu_check.sh is there, well-formed bash,
and refuses what it does not know. (Its 40 BLEU in 5 minutes needs a GPU: measured only in part,
benchmarks/RESULTS.md.)"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

from transduce.cli.main import build_parser
from transduce.config import load_config, parse_overrides, update

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def _readme_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("One GPU: ") : readme.index("### Configuration")]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    lines = [c for b in blocks for c in b.replace("\\\n", " ").splitlines()]
    return [line.split("#")[0].strip() for line in lines if line.strip()]


def test_the_readme_gpu_commands_make_the_gpu_recipe() -> None:
    train, evaluate, check = _readme_commands()
    args = build_parser().parse_args(shlex.split(train)[1:])
    assert args.config == "configs/multi30k_en_de_gpu.yaml"
    cfg = update(load_config(ROOT / args.config), parse_overrides(args.overrides))
    t = cfg.train
    assert (t.device, t.precision, t.pad_multiple, t.compile) == ("cuda", "bf16", "auto", False)
    assert (
        t.max_minutes <= 5
        and t.max_tokens > load_config(ROOT / "configs" / "multi30k_en_de.yaml").train.max_tokens
    )  # larger batches than the CPU hour's
    ev = build_parser().parse_args(shlex.split(evaluate)[1:])
    assert ev.model == ["runs/en_de_gpu/model.pt"] and ev.device == "cuda"
    assert shlex.split(check)[0] == "benchmarks/gpu_check.sh"


def test_gpu_check_is_well_formed_and_refuses_unknown_arguments(tmp_path: Path) -> None:
    assert SCRIPT.is_file() and os.access(SCRIPT, os.X_OK)
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    bad = subprocess.run([str(SCRIPT), "--bogus"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "unknown argument --bogus" in bad.stderr
    bad = subprocess.run(
        [str(SCRIPT), "--device", "tpu", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 2 and not any(tmp_path.iterdir())  # refused before any step ran
    usage = subprocess.run([str(SCRIPT), "--help"], capture_output=True, text=True, timeout=30)
    assert usage.returncode == 0 and "--device cpu" in usage.stdout
