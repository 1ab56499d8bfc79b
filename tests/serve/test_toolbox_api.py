"""The decoding toolbox over HTTP (transduce.serve.native_api, serve.options): ``nbest``,
``scores``, ``alignments``, ``sampling`` and ``prefix`` on ``POST /translate``, ``POST /score``
and ``POST /attention``, each answer checked against the Translator's own, the fields validated,
and the batcher keeping each kind of work with its own kind."""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import urllib.error
import urllib.request
from dataclasses import asdict, replace
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from inference_testkit import save_toy_translation_model, toy_sentences  # noqa: I001
import torch  # noqa: E402

from transduce.config import DecodeConfig  # noqa: E402
from transduce.inference.attention_maps import attention_maps  # noqa: E402
from transduce.inference.translator import Translator  # noqa: E402
from transduce.serve.dynamic_batching import BatchingConfig, DynamicBatcher  # noqa: E402
from transduce.serve.server import ServerLimits, ServerThread, create_app  # noqa: E402
from transduce.serve.work import Work  # noqa: E402

TIMEOUT = 60.0  # seconds, for every HTTP call
LIMITS = ServerLimits(max_sentences=20, max_chars=300, max_beam=8, max_body_bytes=100_000)


@pytest.fixture(scope="module")
def translator(tmp_path_factory) -> Translator:
    path = save_toy_translation_model(
        tmp_path_factory.mktemp("model") / "model.pt",
        {"max_len_offset": 4, "beam": 3, "alpha": 0.6},
        {"n_layers": 2},  # the last layer's attention is not the first's
        # the README's prefix "Ein Hund": refused where the target side cannot write it
        text=["A dog runs on the beach.", "Ein Hund rennt am Strand."] * 20,
    )
    return Translator.load(path)


@pytest.fixture(scope="module")
def server(translator):
    app = create_app(translator, limits=LIMITS, batching=BatchingConfig(batch_wait_ms=20))
    with ServerThread(app) as srv:
        yield srv


def post(srv, path: str, body: dict | bytes) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(srv.url + path, data=data, method="POST")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        with e:
            return e.code, json.loads(e.read())


def ok(srv, path: str, body: dict) -> dict:
    status, out = post(srv, path, body)
    assert status == 200, out
    return out


LINES = [*toy_sentences(4, seed=3), "", *toy_sentences(2, seed=4)]


def test_a_request_without_the_new_fields_is_answered_as_before(server, translator) -> None:
    out = ok(server, "/translate", {"text": LINES, "beam": 2})
    assert out == {"translations": translator.translate(LINES, translator.decode_config(beam=2))}


def test_nbest_and_scores_are_the_translators(server, translator) -> None:
    decode = translator.decode_config(beam=4, alpha=1.0)
    out = ok(server, "/translate", {"text": LINES, "beam": 4, "alpha": 1.0, "nbest": 3})
    expected = translator.translate_nbest(LINES, 3, decode)
    assert set(out) == {"translations", "nbest"}
    assert out["translations"] == [h[0].text for h in expected]
    assert out["translations"] == translator.translate(LINES, decode)
    assert out["nbest"] == [
        [{"translation": h.text, "score": h.score, "log_prob": h.log_prob} for h in hyps]
        for hyps in expected
    ]
    assert max(len(h) for h in out["nbest"]) == 3
    out = ok(server, "/translate", {"text": LINES, "scores": True})
    best = translator.translate_nbest(LINES, 1)
    assert set(out) == {"translations", "scores"}
    assert out["scores"] == [{"score": h[0].score, "log_prob": h[0].log_prob} for h in best]
    assert out["scores"][4] == {"score": 0.0, "log_prob": 0.0}  # the empty line


def test_alignments_are_the_translators(server, translator) -> None:
    out = ok(server, "/translate", {"text": LINES, "alignments": True})
    assert set(out) == {"translations", "alignments"}
    assert out["alignments"] == translator.align(LINES, out["translations"])
    assert out["alignments"][4] == "" and all("-" in a for a in out["alignments"][:4])


def test_prefix_starts_each_translation(server, translator) -> None:
    prefixes = ["", "ein", "", "", "", "der", ""]
    out = ok(server, "/translate", {"text": LINES, "prefix": prefixes, "beam": 2})
    assert out["translations"] == translator.translate(
        LINES, translator.decode_config(beam=2), prefixes=prefixes
    )
    assert out["translations"][1].startswith("ein") and out["translations"][5].startswith("der")


def test_sampling_is_reproducible_for_a_seed(server, translator) -> None:
    sampling = {"seed": 7, "temperature": 1.5, "top_k": 20, "top_p": 0.9}
    body = {"text": LINES, "sampling": sampling, "nbest": 4}
    first, second = ok(server, "/translate", body), ok(server, "/translate", body)
    assert first == second and first["seed"] == 7  # the seed given, said back
    decode = replace(
        translator.decode_config(),
        sampling=True,
        sampling_seed=7,
        temperature=1.5,
        top_k=20,
        top_p=0.9,
    )
    expected = translator.translate_nbest(LINES, 4, decode)  # 4 samples > beam 3: allowed
    assert first["nbest"] == [
        [{"translation": h.text, "score": h.score, "log_prob": h.log_prob} for h in hyps]
        for hyps in expected
    ]
    other = ok(server, "/translate", {**body, "sampling": {**sampling, "seed": 8}})
    assert other["nbest"] != first["nbest"]  # the seed matters
    # without a seed: one drawn at random each time, said in the answer (to draw it again)
    plain = ok(server, "/translate", {"text": LINES * 2, "sampling": {"temperature": 3.0}})
    again = ok(server, "/translate", {"text": LINES * 2, "sampling": {"temperature": 3.0}})
    assert plain["seed"] != again["seed"] and plain["translations"] != again["translations"]
    sampled = replace(
        translator.decode_config(), sampling=True, sampling_seed=plain["seed"], temperature=3.0
    )
    assert plain == {
        "translations": translator.translate(LINES * 2, sampled),
        "seed": plain["seed"],
    }
    with_alpha = {"text": LINES, "sampling": {"seed": 7}, "alpha": 2.0, "nbest": 4}
    ranked = ok(server, "/translate", with_alpha)["nbest"]  # alpha ranks the samples
    expected = translator.translate_nbest(
        LINES, 4, replace(decode, alpha=2.0, top_k=0, top_p=1.0, temperature=1.0)
    )
    assert ranked == [
        [{"translation": h.text, "score": h.score, "log_prob": h.log_prob} for h in hyps]
        for hyps in expected
    ]


def test_score_is_the_translators(server, translator) -> None:
    sources = LINES
    targets = translator.translate(sources)
    out = ok(server, "/score", {"text": sources, "translation": targets, "alpha": 1.0})
    expected = translator.score(sources, targets, translator.decode_config(alpha=1.0))
    assert out == {"scores": [asdict(pair) for pair in expected]}
    assert ok(server, "/score", {"text": [], "translation": []}) == {"scores": []}


def test_attention_is_the_models_last_layer_mean_over_heads(server, translator) -> None:
    source = LINES[0]
    target = translator.translate([source])[0]
    out = ok(server, "/attention", {"text": source, "translation": target})
    maps = attention_maps(translator.model, translator.vocab, source, target)
    assert out["source"] == maps.source and out["target"] == maps.outputs
    weights = torch.tensor(out["weights"])  # (T, S)
    assert weights.shape == (len(maps.outputs), len(maps.source))
    assert torch.allclose(weights, maps.cross[-1].mean(0), atol=1e-4)
    assert torch.allclose(weights.sum(1), torch.ones(len(maps.outputs)), atol=1e-3)
    import transduce.inference.attention_maps as maps_module

    with pytest.MonkeyPatch.context() as m:  # the bound (256 pieces a side) made small
        m.setattr(maps_module, "DRAWN_MAX_TOKENS", 2)
        status, out = post(server, "/attention", {"text": source, "translation": target})
    assert status == 422 and "'text' has" in out["error"] and "at most 2 a side" in out["error"]


@pytest.mark.parametrize(
    ("path", "body", "names"),
    [
        ("/translate", {"text": ["a"], "nbest": 0}, "'nbest' must be between 1 and 8"),
        ("/translate", {"text": ["a"], "nbest": "2"}, "'nbest' must be an integer"),
        ("/translate", {"text": ["a"], "nbest": 5}, "'nbest' (5) must not exceed the beam (3)"),
        ("/translate", {"text": ["a"], "beam": 1, "alpha": 1}, "'alpha' ranks a beam's hypo"),
        ("/translate", {"text": ["a"], "sampling": {"seed": 7}, "alpha": 2}, "n-best samples"),
        ("/translate", {"text": ["a"], "scores": 1}, "'scores' must be a boolean"),
        ("/translate", {"text": ["a"], "alignments": "yes"}, "'alignments' must be a boolean"),
        ("/translate", {"text": ["a"], "sampling": True}, "'sampling' must be an object"),
        ("/translate", {"text": ["a"], "sampling": {"seeds": 1}}, "'sampling.seeds'"),
        ("/translate", {"text": ["a"], "sampling": {"seed": -1}}, "'sampling.seed' must be"),
        ("/translate", {"text": ["a"], "sampling": {"temperature": 0}}, "'sampling.temperature'"),
        ("/translate", {"text": ["a"], "sampling": {"top_p": 1.5}}, "'sampling.top_p' must be"),
        ("/translate", {"text": ["a"], "sampling": {"top_k": 1.5}}, "'sampling.top_k' must be"),
        ("/translate", {"text": ["a"], "nbest": 2.5}, "'nbest' must be an integer, not 2.5"),
        ("/translate", {"text": ["a"], "nbest": 9.0}, "'nbest' must be between 1 and 8; got 9"),
        ("/translate", {"text": ["a"], "nbest": 123456789}, "between 1 and 8; got 123456789"),
        ("/translate", {"text": ["a"], "nbest": 10**400}, "got 10000000000000000000... (401"),
        ("/translate", {"text": ["a"], "sampling": {"seed": 2**64}}, "got 18446744073709551616"),
        ("/translate", {"text": ["a"], "prefix": "x"}, "'prefix' must be a list"),
        ("/translate", {"text": ["a"], "prefix": [1]}, "'prefix[0]' must be a string"),
        ("/translate", {"text": ["a"], "prefix": []}, "'prefix' must have one string"),
        ("/score", {"text": ["a"]}, "missing field 'translation'"),
        ("/score", {"text": ["a"], "translation": ["b", "c"]}, "'translation' must have one"),
        ("/score", {"text": ["a"], "translation": [2]}, "'translation[0]' must be a string"),
        ("/score", {"text": ["a"], "translation": ["b"], "alpha": -1}, "'alpha' must be"),
        ("/score", {"text": ["a"], "translation": ["b"], "beam": 2}, "unknown field 'beam'"),
        ("/attention", {"text": "a"}, "missing field 'translation'"),
        ("/attention", {"text": ["a"], "translation": "b"}, "'text' must be a string"),
        ("/attention", {"text": " ", "translation": "b"}, "'text' must not be empty"),
        ("/attention", {"text": "a", "translation": "b", "source": "en"}, "given together"),
    ],
)
def test_a_bad_field_is_a_422_naming_it(server, path, body, names) -> None:
    status, out = post(server, path, body)
    assert status == 422, out
    assert names in out["error"] and out["status"] == 422


def test_alpha_acts_on_scores_where_it_ranks_nothing(server) -> None:
    """Greedy search or one sample: alpha weighs the scores returned, so it is taken there."""
    for extra in ({"beam": 1}, {"sampling": {"seed": 7}}):
        asked = {"text": ["a b c"], "scores": True, **extra}
        plain, weighed = (
            ok(server, "/translate", asked),
            ok(server, "/translate", {**asked, "alpha": 2.0}),
        )
        assert plain["translations"] == weighed["translations"]
        assert plain["scores"][0]["log_prob"] == weighed["scores"][0]["log_prob"]
        assert plain["scores"][0]["score"] != weighed["scores"][0]["score"]


def test_an_integer_written_with_a_zero_fraction_is_that_integer(server) -> None:
    """JSON has one kind of number and JSON Schema's "integer" (what /openapi.json says of
    these fields) admits 4.0: the server takes it as 4, with the same answer."""
    sampling = {"seed": 7, "top_k": 20}
    whole = ok(server, "/translate", {"text": ["a b"], "beam": 3, "nbest": 2})
    assert ok(server, "/translate", {"text": ["a b"], "beam": 3.0, "nbest": 2.0}) == whole
    drawn = ok(server, "/translate", {"text": ["a b"], "sampling": sampling})
    floats = {"seed": 7.0, "top_k": 20.0}
    assert ok(server, "/translate", {"text": ["a b"], "sampling": floats}) == drawn


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_a_body_not_sent_as_json_is_a_415(server, content_type) -> None:
    """A web page may POST these types (or none) to any server without asking it first (CORS
    "simple requests"): the native API decodes nothing for them."""
    host, port = server.url.removeprefix("http://").split(":")
    for path in ("/translate", "/score", "/attention"):
        conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT)
        headers = {} if content_type is None else {"Content-Type": content_type}
        conn.request("POST", path, body=b'{"text": ["a"]}', headers=headers)
        answer = conn.getresponse()
        out = json.loads(answer.read())
        conn.close()
        assert answer.status == 415, out
        assert "Content-Type: application/json" in out["error"] and out["status"] == 415
    # a JSON type with parameters is JSON
    req = urllib.request.Request(server.url + "/translate", data=b'{"text": ["a"]}', method="POST")
    req.add_header("Content-Type", "application/json; charset=utf-8")
    with urllib.request.urlopen(req, timeout=TIMEOUT) as resp:
        assert resp.status == 200


def test_too_much_is_a_413(server) -> None:
    long = "a" * (LIMITS.max_chars + 1)
    assert post(server, "/translate", {"text": ["a"], "prefix": [long]})[0] == 413
    assert post(server, "/score", {"text": [long], "translation": ["b"]})[0] == 413
    status, out = post(server, "/attention", {"text": "a", "translation": long})
    assert status == 413 and "'translation' is too long: 301 characters" in out["error"]
    status, out = post(server, "/attention", {"text": "\ud800", "translation": "a"})
    assert status == 422 and "'text' is not valid Unicode" in out["error"]


def test_the_rnn_has_no_attention_to_show(tmp_path) -> None:
    path = save_toy_translation_model(
        tmp_path / "rnn.pt", {"max_len_offset": 4, "beam": 2}, {"architecture": "rnn"}
    )
    with ServerThread(create_app(Translator.load(path))) as srv:
        status, out = post(srv, "/attention", {"text": "a dog", "translation": "ein"})
        assert status == 422 and "Transformer" in out["error"]
        assert post(srv, "/score", {"text": ["a dog"], "translation": ["ein"]})[0] == 200


# -- the batcher: each kind of work with its own -------------------------------------------------


class Recorder:
    """A translator recording each call: translate, translate_nbest, score."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def translate(self, sentences, decode=None):
        self.calls.append(("translate", tuple(sentences), decode.sampling_seed))
        return [s.upper() for s in sentences]

    def score(self, sources, targets, decode=None):
        self.calls.append(("score", tuple(sources)))
        return [len(t) for t in targets]


def test_sampling_requests_are_decoded_alone_and_scores_apart() -> None:
    recorder = Recorder()
    batcher = DynamicBatcher(recorder, BatchingConfig(max_batch_sentences=50, batch_wait_ms=20))
    sampled = DecodeConfig(sampling=True, sampling_seed=5)

    async def scenario() -> list:
        futures = [
            batcher.submit(["a"], DecodeConfig()),
            batcher.submit(["b"], sampled),
            batcher.submit([("c", "cc")], DecodeConfig(), work=Work(kind="score")),
            batcher.submit(["d"], sampled),
            batcher.submit(["e"], DecodeConfig()),
            batcher.submit([("f", "f")], DecodeConfig(), work=Work(kind="score")),
        ]
        batcher.start()
        return await asyncio.wait_for(asyncio.gather(*futures), TIMEOUT)

    try:
        results = asyncio.run(scenario())
    finally:
        batcher.stop()
    assert results == [["A"], ["B"], [2], ["D"], ["E"], [1]]
    assert recorder.calls == [
        ("translate", ("a", "e"), 0),
        ("translate", ("b",), 5),
        ("score", ("c", "f")),
        ("translate", ("d",), 5),
    ]


# -- the README ----------------------------------------------------------------------------------

README = Path(__file__).resolve().parents[2] / "README.md"


def _readme_section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(title)
    ends = [text.find(mark, start + len(title)) for mark in ("\n### ", "\n#### ")]
    return text[start : min(end for end in ends if end >= 0)]


def test_readme_toolbox_example_prints_the_translators_answers(server, translator) -> None:
    (python,) = re.findall(
        r"```python\n(.*?)```", _readme_section("#### The decoding toolbox over HTTP"), re.DOTALL
    )
    printed: list[tuple] = []
    namespace = {"print": lambda *args: printed.append(args)}
    code = python.replace("http://127.0.0.1:8000", server.url)
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 (the README's own code)
    sentence = "A dog runs on the beach."
    hyps = translator.translate_nbest([sentence], 2, translator.decode_config(beam=4))[0]
    best = hyps[0]
    assert printed[0] == (
        [best.text],
        [{"score": best.score, "log_prob": best.log_prob}],
        translator.align([sentence], [best.text]),
    )
    assert printed[1] == (
        [[{"translation": h.text, "score": h.score, "log_prob": h.log_prob} for h in hyps]],
    )
    prefixed = translator.translate([sentence], prefixes=["Ein Hund"])
    assert printed[2] == ({"translations": prefixed},)
    sampling = replace(
        translator.decode_config(),
        sampling=True,
        sampling_seed=1,
        temperature=0.8,
        top_k=10,
        top_p=0.9,
    )
    samples = translator.translate_nbest([sentence], 3, sampling)[0]
    assert printed[3] == (
        [[{"translation": h.text, "score": h.score, "log_prob": h.log_prob} for h in samples]],
    )
    pair = translator.score([sentence], ["Ein Hund rennt am Strand."])[0]
    assert printed[4] == ({"scores": [asdict(pair)]},)
    maps = attention_maps(translator.model, translator.vocab, sentence, best.text)
    source, target, weights = printed[5]
    assert (source, target) == (maps.source, maps.outputs)
    assert torch.allclose(torch.tensor(weights), maps.cross[-1].mean(0), atol=1e-4)


def test_readme_page_command_and_screenshot() -> None:
    from transduce.cli.main import build_parser

    section = _readme_section("#### A page to try a model")
    (bash,) = re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)
    command = next(line for line in bash.splitlines() if line.startswith("transduce serve"))
    args = build_parser().parse_args(command.split()[1:])
    assert args.model == ["runs/en_de/model.pt"] and args.port == 8000
    (image,) = re.findall(r"!\[[^\]]*\]\((docs/[^)]+\.png)\)", section)
    png = README.parent / image
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size < 150_000


def test_attention_counts_the_translation_in_the_target_vocabulary(tmp_path) -> None:
    # two vocabularies and learned positions: the translation's length in its own (target)
    # pieces decides, a one-line UserError (the server's 422), not a failure deep in the model
    from inference_testkit import save_toy_pair_translator

    from transduce.errors import UserError
    from transduce.inference.attention_maps import sides
    from transduce.serve.work import attention

    path = save_toy_pair_translator(
        tmp_path / "pair.pt",
        {"max_len_offset": 4, "beam": 2},
        {"positional": "learned", "max_positions": 12},
    )
    translator = Translator.load(path)
    src_vocab, tgt_vocab = sides(translator.vocab)
    words = toy_sentences(50)[0].split() * 10
    n = next(k for k in range(1, len(words)) if len(tgt_vocab.encode(" ".join(words[:k]))) >= 12)
    long = " ".join(words[:n])
    assert len(src_vocab.encode(long)) < len(tgt_vocab.encode(long))  # the two counts differ
    with pytest.raises(UserError, match=rf"'translation' has {len(tgt_vocab.encode(long))} sub"):
        attention(translator, "a dog", long)


def test_search_settings_with_sampling_and_every_field_of_an_empty_request_are_checked(
    server,
) -> None:
    status, out = post(server, "/translate", {"text": ["a"], "sampling": {"seed": 1}, "beam": 2})
    assert status == 422 and "'beam' goes with search" in out["error"]  # (alpha ranks samples)
    status, out = post(server, "/translate", {"text": [], "beam": 2, "nbest": 3})
    assert status == 422 and "'nbest' (3) must not exceed the beam (2)" in out["error"]
    assert post(server, "/translate", {"text": [], "beam": 2, "nbest": 2}) == (
        200,
        {"translations": [], "nbest": []},
    )


def test_the_models_beam_is_capped_by_max_beam(translator) -> None:
    # the model decodes with beam 3; a server of max_beam 2 decodes with 2 when none is asked
    limits = replace(LIMITS, max_beam=2)
    with ServerThread(create_app(translator, limits=limits)) as srv:
        texts = toy_sentences(6, seed=4)
        status, out = post(srv, "/translate", {"text": texts})
        assert status == 200
        assert out["translations"] == translator.translate(texts, translator.decode_config(beam=2))
        with urllib.request.urlopen(srv.url + "/health", timeout=TIMEOUT) as resp:
            assert json.loads(resp.read())["decode"]["beam"] == 2  # what is used
        assert post(srv, "/translate", {"text": texts[:1], "nbest": 2})[0] == 200
        status, out = post(srv, "/translate", {"text": texts[:1], "nbest": 3})
        assert status == 422
        with urllib.request.urlopen(srv.url + "/health", timeout=TIMEOUT) as resp:
            assert json.loads(resp.read())["model"]["architecture"] == "transformer"


def test_a_model_that_samples_draws_anew_each_request_and_searches_for_a_beam(tmp_path) -> None:
    path = save_toy_translation_model(
        tmp_path / "sampler.pt",
        {"sampling": True, "sampling_seed": 7, "beam": 3, "temperature": 3.0},
    )
    sampler = Translator.load(path)
    texts = toy_sentences(8, seed=6)
    with ServerThread(create_app(sampler, limits=LIMITS)) as srv:
        with urllib.request.urlopen(srv.url + "/health", timeout=TIMEOUT) as resp:
            defaults = json.loads(resp.read())["decode"]  # what a request of nothing does
        assert (defaults["sampling"], defaults["temperature"], defaults["top_k"]) == (True, 3.0, 0)
        first, second = (ok(srv, "/translate", {"text": texts}) for _ in range(2))
        assert first["seed"] != second["seed"] and first["translations"] != second["translations"]
        drawn = replace(sampler.decode_config(), sampling_seed=first["seed"])
        assert first["translations"] == sampler.translate(texts, drawn)
        searched = ok(srv, "/translate", {"text": texts, "beam": 2})
        search = sampler.decode_config(beam=2)  # a search
        assert not search.sampling
        assert searched == {"translations": sampler.translate(texts, search)}
    # a server whose --max-beam is under the model's beam still samples (the cap is no request)
    with ServerThread(create_app(sampler, limits=replace(LIMITS, max_beam=2))) as srv:
        capped = ok(srv, "/translate", {"text": texts})
        drawn = replace(sampler.decode_config(), sampling_seed=capped["seed"])
        assert capped["translations"] == sampler.translate(texts, drawn)
