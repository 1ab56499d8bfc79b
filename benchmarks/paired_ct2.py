"""CTranslate2 timed in turns with the systems of this process: a CTranslate2 process that runs
one job per request, and a schedule that times every system once a round, in rotated order.

    python benchmarks/paired_ct2.py SPEC.json     (the worker; started by ``Ct2Server``)

Why: a figure of CTranslate2 timed in its own process minutes before or after ours moved the
ratios between the two by up to 30% on a shared 2-core machine (benchmarks/RESULTS.md). With
both timed in the same rounds, each round's ratio compares calls seconds apart, and the median of
those ratios is what the benchmarks report.

The worker imports only ctranslate2 (no torch: the two would share one OpenMP runtime). It loads
the spec's model, prints one JSON line (``check_log_probs`` of the spec's check pair,
``ctranslate2``, ``torch_imported``), then for each line of its standard input naming one of the
spec's jobs runs ``translate_batch`` once on that job's batch and options and prints
``{"s": seconds, "lengths": [...]}``; "quit" or the end of its input ends it. Its OpenMP threads
may spin for a while after a call (Intel's OpenMP: 200 ms by default), so ``paired_rounds``
sleeps ``settle`` seconds after every call of every system before timing the next.
"""

from __future__ import annotations

import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Seconds of sleep after each timed call: longer than Intel OpenMP's default spin (200 ms)
SETTLE_S = 0.25


def serve(spec_path: str) -> None:
    """The worker loop (above)."""
    import ctranslate2

    spec = json.loads(Path(spec_path).read_text())
    translator = ctranslate2.Translator(
        spec["model_dir"],
        device="cpu",
        intra_threads=spec["threads"],
        inter_threads=1,
        compute_type=spec.get("compute_type", "default"),
    )
    check = translator.score_batch([spec["check"]["source"]], [spec["check"]["target"]])[0]
    hello = {
        "check_log_probs": list(check.log_probs),
        "ctranslate2": ctranslate2.__version__,
        "torch_imported": "torch" in sys.modules,
    }
    print(json.dumps(hello), flush=True)
    for line in sys.stdin:
        name = line.strip()
        if name == "quit":
            break
        job = spec["jobs"][name]
        start = time.perf_counter()
        results = translator.translate_batch(job["batch"], **job["options"])
        seconds = time.perf_counter() - start
        lengths = sorted({len(r.hypotheses[0]) for r in results})
        print(json.dumps({"s": seconds, "lengths": lengths}), flush=True)


class Ct2Failed(RuntimeError):
    """The CTranslate2 worker did not start or did not answer (its standard error in the text)."""


class Ct2Server:
    """A running worker (above) on ``spec`` (a dict: model_dir, threads, compute_type, check,
    jobs), with ``env`` added to its environment. ``info``: its first line. ``run(job)``: the
    seconds of one call, timed in the worker; ``lengths``: every output length seen. A
    ``Ct2Failed`` where it does not start or answer within ``timeout`` seconds."""

    def __init__(self, spec: dict[str, Any], env: dict[str, str], timeout: float) -> None:
        self.timeout = timeout
        self.lengths: set[int] = set()
        self._dir = tempfile.TemporaryDirectory()
        spec_path = Path(self._dir.name) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        self._stderr = open(Path(self._dir.name) / "stderr", "w+")  # noqa: SIM115 (closed in close)
        self.proc = subprocess.Popen(
            [sys.executable, __file__, str(spec_path)],
            env={**os.environ, **env},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        try:
            self.info: dict[str, Any] = self._answer()
        except Ct2Failed:
            self.close()
            raise

    def _answer(self) -> dict[str, Any]:
        """The worker's next JSON line."""
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.proc.kill()
            self.proc.wait()
            self._stderr.seek(0)
            lines = self._stderr.read().strip().splitlines()  # its last line: the error
            why = lines[-1][-300:] if lines else f"no answer in {self.timeout} s"
            raise Ct2Failed(f"exit {self.proc.returncode}: {why}")
        return json.loads(line)

    def run(self, job: str) -> float:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(job + "\n")
            self.proc.stdin.flush()
        except OSError:  # the worker has exited: _answer says why
            pass
        out = self._answer()
        self.lengths.update(out["lengths"])
        return float(out["s"])

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()
        self._dir.cleanup()


def paired_rounds(
    systems: dict[str, Callable[[], float]], rounds: int, settle: float = SETTLE_S
) -> dict[str, list[float]]:
    """Each system's seconds in each of ``rounds`` rounds: one warm-up call each, then every
    round calls every system once, the order rotated by one a round; ``settle`` seconds of
    sleep after every call. A system is a function that runs the job once and returns its
    seconds."""
    names = list(systems)
    for name in names:
        systems[name]()
        time.sleep(settle)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            times[name].append(systems[name]())
            time.sleep(settle)
    return times


def time_in_turns(
    runs: dict[str, dict[str, Callable[[], float]]],
    rounds: dict[str, int],
    settle: float = SETTLE_S,
    label: str = "",
) -> dict[str, dict[str, list[float]]]:
    """``paired_rounds`` job by job: ``runs`` maps each system to its jobs (a function a job,
    returning its seconds), ``rounds`` each job to its number of rounds. Returns each system's
    seconds by job and round; says on stderr which job is being timed."""
    times: dict[str, dict[str, list[float]]] = {name: {} for name in runs}
    for job, n in rounds.items():
        print(f"{label}timing {job}: {', '.join(runs)} in turns ...", file=sys.stderr, flush=True)
        for name, t in paired_rounds({k: r[job] for k, r in runs.items()}, n, settle).items():
            times[name][job] = t
    return times


def timed(fn: Callable[[], object]) -> Callable[[], float]:
    """``fn`` as a system of ``paired_rounds``: its seconds, by the wall clock."""

    def run() -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    return run


def paired_ratio(numerator: list[float], denominator: list[float]) -> float:
    """The median over rounds of numerator[r] / denominator[r] (times of the same rounds)."""
    if len(numerator) != len(denominator) or not numerator:
        raise ValueError(f"rounds differ: {len(numerator)} against {len(denominator)}")
    return statistics.median(a / b for a, b in zip(numerator, denominator, strict=True))


if __name__ == "__main__":
    serve(sys.argv[1])
