"""benchmarks/paired_ct2.py: the rounds that time every system in turns, the paired ratio, the
CTranslate2 worker answering one job a request; decode.py's ratios from paired rounds."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchmark_testkit import TINY, load_benchmark

paired = load_benchmark("paired_ct2")


def test_every_round_calls_every_system_once_in_rotated_order() -> None:
    calls: list[str] = []

    def system(name: str):
        return lambda: calls.append(name) or float(len(calls))

    times = paired.paired_rounds({k: system(k) for k in "abc"}, rounds=4, settle=0.0)
    assert calls[:3] == ["a", "b", "c"]  # the warm-up calls, not timed
    rounds = [calls[3 + 3 * r : 6 + 3 * r] for r in range(4)]
    assert rounds == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    # each system's seconds are what its calls returned, by round: a's call numbers 4, 9, 11, 13
    assert times["a"] == [4.0, 9.0, 11.0, 13.0] and len(times["c"]) == 4


def test_the_paired_ratio_is_the_median_of_the_rounds_ratios() -> None:
    # the machine slows 2x in round 2: the medians' ratio (2.0 / 1.5) is off, the rounds' is 2
    ours, theirs = [1.0, 2.0, 1.0], [2.0, 4.0, 2.0]
    assert paired.paired_ratio(theirs, ours) == 2.0
    assert paired.paired_ratio([1.0, 3.0], [1.0, 1.0]) == 2.0  # even: the middle two's mean
    with pytest.raises(ValueError, match="rounds differ"):
        paired.paired_ratio([1.0], [1.0, 2.0])


def test_decodes_ratios_take_the_rounds_where_both_have_them() -> None:
    dec = load_benchmark("decode", "decode_bench")
    # rounds 1 and 3 say theirs takes twice ours; round 2 eight times: paired 2, where the
    # medians (8 against 1) would say 8, the machine having slowed in rounds 2 and 3
    ours = {"beam4_times": [1.0, 1.0, 4.0], "b1_times": [1.0, 1.0, 4.0]}
    theirs = {"beam4_times": [2.0, 8.0, 8.0], "b1_times": [2.0, 8.0, 8.0]}
    assert dec.ratio(ours, theirs, "beam4") == 2.0  # theirs over ours: ours twice as fast
    assert dec.ratio(ours, theirs, "b1") == 0.5  # latency: ours over theirs
    # without rounds (or of other lengths): from the figures
    assert dec.ratio({"beam4_sent_s": 3.0}, {"beam4_sent_s": 1.0}, "beam4") == 3.0
    assert dec.ratio({"b1_s": 1.0, "b1_times": [1.0]}, {"b1_s": 4.0, "b1_times": []}, "b1") == 0.25


def test_a_worker_answers_one_job_a_request(tmp_path: Path) -> None:
    pytest.importorskip("ctranslate2")
    from transduce.data.vocab import SPECIALS
    from transduce.export.ctranslate2 import export_model

    dec = load_benchmark("decode", "decode_bench")
    ours = dec.build_ours(TINY)
    tokens = [*SPECIALS, *(f"t{i}" for i in range(4, TINY["vocab"]))]
    export_model(ours, tokens, tmp_path / "ct2", max_positions=1024)
    batch = [[f"t{i}" for i in range(5, 12)], [f"t{i}" for i in range(20, 24)]]
    spec = {
        "model_dir": str(tmp_path / "ct2"),
        "threads": 1,
        "check": {"source": batch[0], "target": ["t7", "t9"]},
        "jobs": dec.ct2_jobs(batch),
    }
    server = paired.Ct2Server(spec, {}, timeout=120)
    try:
        assert server.info["torch_imported"] is False
        assert len(server.info["check_log_probs"]) == 3  # two tokens and EOS
        for job in ("greedy", "beam4", "b1", "beam4"):
            assert server.run(job) > 0
        assert server.lengths == {dec.STEPS}
    finally:
        server.close()
    assert server.proc.returncode == 0
    # a worker that dies between calls: the next call says so (not a broken pipe)
    server = paired.Ct2Server(spec, {}, timeout=120)
    try:
        server.proc.kill()
        server.proc.wait()
        with pytest.raises(paired.Ct2Failed, match="exit -9"):
            server.run("greedy")
    finally:
        server.close()


def test_a_worker_that_cannot_start_says_why(tmp_path: Path) -> None:
    pytest.importorskip("ctranslate2")
    spec = {"model_dir": str(tmp_path / "nothing"), "threads": 1, "check": {}, "jobs": {}}
    with pytest.raises(paired.Ct2Failed, match="exit 1: RuntimeError: .*model.bin.*nothing"):
        paired.Ct2Server(spec, {}, timeout=60)
