"""The LibreTranslate API of ``transduce serve`` (transduce.serve.libretranslate): the real
``libretranslatepy`` client, and plain HTTP where it cannot go (a list of texts, JSON bodies),
against a real uvicorn server on a free 127.0.0.1 port, with two tiny untrained models (their
translations are meaningless but deterministic: compared with ``Translator.translate``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
libretranslatepy = pytest.importorskip("libretranslatepy")

from inference_testkit import save_toy_translation_model, toy_sentences

from transduce.inference.translator import Translator
from transduce.serve.guard import ApiKey
from transduce.serve.server import (
    ServedModel,
    ServerLimits,
    ServerThread,
    create_app,
)

TIMEOUT = 60.0
TOKEN = "s3cret-token"
LIMITS = ServerLimits(max_sentences=20, max_chars=300)
README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture(scope="module")
def translators(tmp_path_factory) -> dict[str, Translator]:
    """en->de and de->en: two different tiny models (other FFN sizes, so other weights)."""
    folder = tmp_path_factory.mktemp("models")
    decode = {"max_len_offset": 4, "beam": 3, "alpha": 0.6}
    en_de = save_toy_translation_model(folder / "en-de.pt", decode)
    de_en = save_toy_translation_model(folder / "de-en.pt", decode, {"d_ff": 48})
    return {
        "en-de": Translator.load(en_de),
        "de-en": Translator.load(de_en),
        "en-de.path": en_de,
        "de-en.path": de_en,
    }  # type: ignore[dict-item]


def _app(translators, api_key: ApiKey | None = None):
    models = [
        ServedModel(translators["en-de"], "en", "de", name="en-de.pt"),
        ServedModel(translators["de-en"], "de", "en", name="de-en.pt"),
    ]
    return create_app(models, limits=LIMITS, api_key=api_key)


@pytest.fixture(scope="module")
def server(translators):
    with ServerThread(_app(translators)) as srv:
        yield srv


@pytest.fixture(scope="module")
def keyed_server(translators):
    with ServerThread(_app(translators, ApiKey(TOKEN))) as srv:
        yield srv


def call(
    url: str, body: dict | bytes | None = None, *, form: bool = False, method: str | None = None
):
    """(status, decoded JSON) of one call: a dict is sent as JSON, or as a form with ``form``."""
    headers = {}
    if isinstance(body, dict):
        if form:
            body = urllib.parse.urlencode(body).encode()
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        else:
            body = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        with e:
            return e.code, json.loads(e.read())


def lt_url(srv: ServerThread) -> str:
    return srv.url + "/libretranslate/"


# -- the client ---------------------------------------------------------------------------------


def test_client_translates_a_string_as_the_translator_does(server, translators) -> None:
    client = libretranslatepy.LibreTranslateAPI(lt_url(server))
    for sentence in toy_sentences(3, seed=1):
        expected = translators["en-de"].translate([sentence])[0]
        assert client.translate(sentence, "en", "de", timeout=TIMEOUT) == expected


def test_two_models_picked_by_source_and_target(server, translators) -> None:
    client = libretranslatepy.LibreTranslateAPI(lt_url(server))
    sentences = toy_sentences(4, seed=2)
    into_de = [client.translate(s, "en", "de", timeout=TIMEOUT) for s in sentences]
    into_en = [client.translate(s, "de", "en", timeout=TIMEOUT) for s in sentences]
    assert into_de == translators["en-de"].translate(sentences)
    assert into_en == translators["de-en"].translate(sentences)
    assert into_de != into_en  # two models, not one answering twice


def test_client_languages(server) -> None:
    client = libretranslatepy.LibreTranslateAPI(lt_url(server))
    assert client.languages(timeout=TIMEOUT) == [
        {"code": "en", "name": "English", "targets": ["de"]},
        {"code": "de", "name": "German", "targets": ["en"]},
    ]


def test_client_unknown_pair_is_400_in_libretranslate_shape(server) -> None:
    client = libretranslatepy.LibreTranslateAPI(lt_url(server))
    with pytest.raises(urllib.error.HTTPError) as info:
        client.translate("a dog", "en", "fr", timeout=TIMEOUT)
    with info.value as e:
        assert e.code == 400 and json.loads(e.read()) == {"error": "fr is not supported"}
    status, out = call(lt_url(server) + "translate", {"q": "a dog", "source": "en", "target": "en"})
    assert status == 400 and set(out) == {"error"}
    assert out["error"].startswith("en is not available as a target language from en")
    status, out = call(lt_url(server) + "translate", {"q": "a dog", "source": "xx", "target": "de"})
    assert (status, out) == (400, {"error": "xx is not supported"})


def test_client_detect_with_two_source_languages_is_a_clear_400(server) -> None:
    client = libretranslatepy.LibreTranslateAPI(lt_url(server))
    with pytest.raises(urllib.error.HTTPError) as info:
        client.detect("a dog", timeout=TIMEOUT)
    with info.value as e:
        assert e.code == 400 and "detection is not supported" in json.loads(e.read())["error"]


def test_api_key_missing_or_wrong(keyed_server, translators) -> None:
    url = lt_url(keyed_server)
    sentence = toy_sentences(1, seed=3)[0]
    good = libretranslatepy.LibreTranslateAPI(url, api_key=TOKEN)
    assert (
        good.translate(sentence, "en", "de", timeout=TIMEOUT)
        == translators["en-de"].translate([sentence])[0]
    )
    assert [lang["code"] for lang in good.languages(timeout=TIMEOUT)] == ["en", "de"]
    for api_key, status in ((None, 400), ("wrong", 403)):
        client = libretranslatepy.LibreTranslateAPI(url, api_key=api_key)
        with pytest.raises(urllib.error.HTTPError) as info:
            client.translate(sentence, "en", "de", timeout=TIMEOUT)
        with info.value as e:
            body = json.loads(e.read())
            assert e.code == status and set(body) == {"error"}, body
    # /languages is open, as LibreTranslate's is; the native API still wants its bearer token
    plain = libretranslatepy.LibreTranslateAPI(url)
    assert len(plain.languages(timeout=TIMEOUT)) == 2
    status, _ = call(keyed_server.url + "/translate", {"text": ["a"]})
    assert status == 401
    status, out = call(
        url + "translate", {"q": "a", "source": "en", "target": "de", "api_key": TOKEN}
    )
    assert status == 200 and isinstance(out["translatedText"], str)


# -- what the client cannot send ------------------------------------------------------------------


def test_a_list_of_texts_in_json(server, translators) -> None:
    sentences = toy_sentences(5, seed=4)
    body = {"q": sentences, "source": "de", "target": "en", "format": "text"}
    status, out = call(lt_url(server) + "translate", body)
    assert status == 200 and out == {"translatedText": translators["de-en"].translate(sentences)}


def test_lines_are_translated_one_by_one(server, translators) -> None:
    a, b = toy_sentences(2, seed=5)
    status, out = call(
        lt_url(server) + "translate",
        {"q": f"{a}\r\n\n{b}", "source": "en", "target": "de"},
        form=True,
    )
    ta, tb = translators["en-de"].translate([a, b])
    assert status == 200 and out == {"translatedText": f"{ta}\n\n{tb}"}


def test_alternatives_are_the_n_best(server, translators) -> None:
    sentence = toy_sentences(1, seed=6)[0]
    status, out = call(
        lt_url(server) + "translate",
        {"q": sentence, "source": "en", "target": "de", "alternatives": 2},
    )
    assert status == 200, out
    nbest = [h.text for h in translators["en-de"].translate_nbest([sentence], 3)[0]]
    assert out["translatedText"] == nbest[0]
    assert out["alternatives"] == [
        t for i, t in enumerate(nbest[1:], 1) if t != nbest[0] and t not in nbest[1:i]
    ]
    status, out = call(
        lt_url(server) + "translate",
        {"q": sentence, "source": "en", "target": "de", "alternatives": "3"},
        form=True,
    )
    assert status == 400 and "alternatives parameter must be <= 2" in out["error"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"source": "en", "target": "de"}, "Invalid request: missing q parameter"),
        ({"q": "a", "target": "de"}, "Invalid request: missing source parameter"),
        ({"q": "a", "source": "en"}, "Invalid request: missing target parameter"),
        ({"q": "<b>a</b>", "source": "en", "target": "de", "format": "rtf"}, "rtf format"),
        ({"q": "a", "source": "en", "target": "de", "alternatives": "x"}, "not a number"),
        ({"q": [1], "source": "en", "target": "de"}, "list of strings"),
        ({"q": ["a"] * 21, "source": "en", "target": "de"}, "exceeds the limit"),
        ({"q": "a" * 301, "source": "en", "target": "de"}, "exceeds text limit"),
        ({"q": "a", "source": "auto", "target": "fr"}, "cannot detect the source language"),
    ],
)
def test_bad_requests_get_libretranslate_errors(server, body, message) -> None:
    status, out = call(lt_url(server) + "translate", body)
    assert status == 400 and set(out) == {"error"} and message in out["error"], out


def test_bodies_that_are_not_objects_or_forms(server) -> None:
    url = lt_url(server) + "translate"
    req = urllib.request.Request(url, data=b"[1]", headers={"Content-Type": "application/json"})
    status, out = _send(req)
    assert status == 400 and out["error"].startswith("Invalid JSON format")
    req = urllib.request.Request(
        url, data=b"--x\r\nno headers", headers={"Content-Type": "multipart/form-data; boundary=x"}
    )
    status, out = _send(req)
    assert status == 400 and "the multipart form cannot be read" in out["error"], out
    status, out = call(url, b"q=a&target=de")  # urllib's default content type: a form
    assert (status, out) == (400, {"error": "Invalid request: missing source parameter"})


def _send(req: urllib.request.Request):
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        with e:
            return e.code, json.loads(e.read())


def test_auto_source_when_the_target_has_one(server, translators) -> None:
    sentence = toy_sentences(1, seed=7)[0]
    status, out = call(
        lt_url(server) + "translate", {"q": [sentence], "source": "auto", "target": "en"}
    )
    assert status == 200
    assert out == {
        "translatedText": translators["de-en"].translate([sentence]),
        "detectedLanguage": [{"confidence": 100.0, "language": "de"}],
    }


def test_native_api_keeps_its_shape_and_picks_by_source_target(server, translators) -> None:
    sentences = toy_sentences(3, seed=8)
    status, out = call(server.url + "/translate", {"text": sentences})
    assert (status, out) == (200, {"translations": translators["en-de"].translate(sentences)})
    status, out = call(
        server.url + "/translate", {"text": sentences, "source": "de", "target": "en"}
    )
    assert (status, out) == (200, {"translations": translators["de-en"].translate(sentences)})
    status, out = call(
        server.url + "/translate", {"text": sentences, "source": "fr", "target": "en"}
    )
    assert status == 422 and "no model translates fr into en" in out["error"]
    status, out = call(server.url + "/translate", {"text": sentences, "source": "de"})
    assert status == 422 and "together" in out["error"]
    status, health = call(server.url + "/health")
    assert [(m["name"], m["source"], m["target"]) for m in health["models"]] == [
        ("en-de.pt", "en", "de"),
        ("de-en.pt", "de", "en"),
    ]


def test_one_model_without_languages(translators) -> None:
    with ServerThread(create_app(translators["en-de"])) as srv:
        status, out = call(lt_url(srv) + "translate", {"q": "a", "source": "en", "target": "de"})
        assert status == 400 and "--model SOURCE:TARGET=PATH" in out["error"]
        assert call(lt_url(srv) + "languages")[1] == []


def test_detect_with_one_source_language(translators) -> None:
    app = create_app([ServedModel(translators["en-de"], "en", "de")])
    with ServerThread(app) as srv:
        client = libretranslatepy.LibreTranslateAPI(lt_url(srv))
        assert client.detect("a dog", timeout=TIMEOUT) == [{"confidence": 100.0, "language": "en"}]


def test_health_as_libretranslate_answers_it(keyed_server) -> None:
    assert call(lt_url(keyed_server) + "health") == (200, {"status": "ok"})  # a probe, no key


def test_a_language_spelt_in_two_cases_is_one_language(translators) -> None:
    """Codes match case aside; en and EN were listed as two languages, and /detect refused."""
    models = [
        ServedModel(translators["en-de"], "en", "de"),
        ServedModel(translators["de-en"], "EN", "fr"),
    ]
    with ServerThread(create_app(models)) as srv:
        client = libretranslatepy.LibreTranslateAPI(lt_url(srv))
        languages = client.languages(timeout=TIMEOUT)
        assert [(lang["code"], lang["targets"]) for lang in languages] == [
            ("en", ["de", "fr"]),
            ("de", []),
            ("fr", []),
        ]
        assert client.detect("a dog", timeout=TIMEOUT) == [{"confidence": 100.0, "language": "en"}]


# -- the command line and the README ------------------------------------------------------------


def test_cli_refuses_a_second_model_without_languages(translators, capsys) -> None:
    from transduce.cli.main import main

    en_de, de_en = str(translators["en-de.path"]), str(translators["de-en.path"])
    serve = ["--no-malloc-tuning", "serve", "--port", "0"]
    assert main([*serve, "--model", en_de, "--model", f"de:en={de_en}"]) == 2
    err = capsys.readouterr().err
    assert "SOURCE:TARGET=PATH" in err and en_de in err and len(err.strip().splitlines()) == 1
    assert main([*serve, "--model", f"en:de={en_de}", "--model", f"EN:DE={de_en}"]) == 2
    assert "two models translate en into de" in capsys.readouterr().err


def _section() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("#### LibreTranslate clients")
    return text[start : text.index("\n### ", start)]


def test_readme_commands_and_client_example(translators, tmp_path) -> None:
    """The README's commands parse; its serve command, with the test's models, serves the
    client example shown, which prints what the models translate."""
    from transduce.cli.main import build_parser

    section = _section()
    (bash,) = re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)
    (python,) = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    command = next(line for line in bash.splitlines() if line.startswith("transduce serve"))
    argv = command.split()[1:]
    args = build_parser().parse_args(argv)
    assert [m.split("=")[0] for m in args.model] == ["en:de", "de:en"]
    paths = {"en:de": str(translators["en-de.path"]), "de:en": str(translators["de-en.path"])}
    argv = [
        f"{a.split('=')[0]}={paths[a.split('=')[0]]}" if "=" in a and a[:5] in paths else a
        for a in argv
    ]
    argv[argv.index("--port") + 1] = "0"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "transduce",
        "--no-malloc-tuning",
        *argv,
        "--threads",
        "1",
        "--log-level",
        "warning",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line.startswith("transduce: serving "), (line, proc.stderr.read())
        base = line.split(" on ")[-1].strip()
        deadline = time.monotonic() + TIMEOUT
        while True:  # the socket listens before the app has started: wait for /health
            try:
                if call(base + "/health")[0] == 200:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert time.monotonic() < deadline, "the server never became healthy"
            time.sleep(0.1)
        script = python.replace("http://127.0.0.1:8000", base)
        run = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            check=False,
            timeout=TIMEOUT,
            env=env,
        )
        assert run.returncode == 0, run.stderr
        sentence = "A dog runs on the beach."
        expected = [
            translators["en-de"].translate([sentence])[0],
            repr(translators["de-en"].translate([sentence, sentence])),
        ]
        assert run.stdout.splitlines()[1:] == expected
    finally:
        proc.terminate()
        code = proc.wait(TIMEOUT)
    assert code == 0  # SIGTERM: a graceful shutdown, both models' batchers stopped


def _raw(url: str, data: bytes | None, headers: dict[str, str], method: str = "POST"):
    """(status, headers, body bytes) of one request sent as given."""
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.headers, e.read()


def test_forms_as_flask_reads_them(server, translators) -> None:
    # raw UTF-8 in a form (curl -d sends it so), and fields in the query string, the query's
    # first (Flask's request.values, which LibreTranslate reads)
    url = lt_url(server) + "translate"
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    text = "Grüße dog"
    status, _, body = _raw(url, f"q={text}&source=en&target=de".encode(), form)
    assert status == 200, body
    assert json.loads(body)["translatedText"] == translators["en-de"].translate([text])[0]
    query = urllib.parse.urlencode({"q": text, "source": "en", "target": "de"})
    status, _, body = _raw(f"{url}?{query}", b"", form)
    assert (
        status == 200
        and json.loads(body)["translatedText"] == (translators["en-de"].translate([text])[0])
    )
    status, _, body = _raw(f"{url}?target=en", b"q=Hund&source=de&target=xx", form)
    assert status == 200, body  # the query's target, not the body's
    status, _, body = _raw(url, b"q=\xff&source=en&target=de", form)
    assert status == 400 and "not valid URL-encoded UTF-8" in json.loads(body)["error"]


def test_browser_apps_on_other_origins_may_call_it(server) -> None:
    url = lt_url(server)
    cors = {"Origin": "http://example.com", "Access-Control-Request-Method": "POST"}
    status, headers, _ = _raw(url + "translate", None, cors, method="OPTIONS")
    assert status == 204 and headers["Access-Control-Allow-Origin"] == "*"
    assert "Content-Type" in headers["Access-Control-Allow-Headers"]
    for path, data in (("languages", None), ("translate", b"{}")):
        method = "GET" if data is None else "POST"
        json_type = {"Content-Type": "application/json", "Origin": "http://example.com"}
        status, headers, _ = _raw(url + path, data, json_type, method=method)
        assert headers["Access-Control-Allow-Origin"] == "*", (path, status)  # errors too


def test_frontend_settings_for_libretranslates_page(server, keyed_server) -> None:
    status, settings = call(lt_url(server) + "frontend/settings", method="GET")
    assert status == 200
    assert settings["charLimit"] == LIMITS.max_chars and settings["keyRequired"] is False
    assert settings["language"] == {
        "source": {"code": "en", "name": "English"},
        "target": {"code": "de", "name": "German"},
    }
    status, settings = call(lt_url(keyed_server) + "frontend/settings", method="GET")
    assert status == 200 and settings["keyRequired"] is True  # open, as LibreTranslate's


def test_a_wrong_bearer_token_is_a_wrong_key(keyed_server) -> None:
    url = lt_url(keyed_server) + "translate"
    body = json.dumps({"q": "a", "source": "en", "target": "de"}).encode()
    for token, status in ((TOKEN, 200), ("wrong", 403)):
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
        assert _raw(url, body, headers)[0] == status
    query = urllib.parse.urlencode({"api_key": TOKEN})
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    assert _raw(f"{url}?{query}", b"q=a&source=en&target=de", form)[0] == 200


def test_the_models_beam_is_capped_by_max_beam_here_too(translators) -> None:
    # the models decode with beam 3; under max_beam 2 LibreTranslate's translation is beam 2's
    # and its alternatives at most 1, as on the native API
    from dataclasses import replace

    models = [ServedModel(translators["en-de"], "en", "de", name="en-de.pt")]
    app = create_app(models, limits=replace(LIMITS, max_beam=2))
    sentences = toy_sentences(6, seed=4)
    en_de = translators["en-de"]
    with ServerThread(app) as srv:
        status, out = call(
            lt_url(srv) + "translate", {"q": sentences, "source": "en", "target": "de"}
        )
        assert status == 200
        assert out["translatedText"] == en_de.translate(sentences, en_de.decode_config(beam=2))
        body = {"q": sentences[0], "source": "en", "target": "de", "alternatives": 2}
        status, out = call(lt_url(srv) + "translate", body)
        assert status == 400 and "alternatives parameter must be <= 1" in out["error"]


def test_html_as_mastodon_sends_it_keeps_the_markup(server, translators) -> None:
    # Mastodon's LibreTranslate client posts every status as format html
    sentences = toy_sentences(3, seed=5)
    html = (
        f'<p>{sentences[0]} <a href="https://x.org/@a" class="mention">@<span>a</span></a></p>'
        f"<p>{sentences[1]}<br />  {sentences[2]} &amp;</p><pre>keep &lt;me&gt;</pre>"
    )
    body = {"q": html, "source": "en", "target": "de", "format": "html"}
    status, out = call(lt_url(server) + "translate", body)
    t = translators["en-de"].translate
    a = t(["a"])[0]
    want = (
        f'<p>{t([sentences[0]])[0]} <a href="https://x.org/@a" class="mention">{t(["@"])[0]}'
        f"<span>{a}</span></a></p><p>{t([sentences[1]])[0]}<br />  "
        f"{t([sentences[2] + ' &'])[0]}</p><pre>keep &lt;me&gt;</pre>"
    )
    assert status == 200 and out == {"translatedText": want}
    status, out = call(lt_url(server) + "translate", {**body, "q": "<p></p>"})
    assert status == 200 and out == {"translatedText": "<p></p>"}  # no text: nothing asked


@pytest.mark.parametrize(
    ("method", "path", "status", "said"),
    [
        ("POST", "suggest", 403, "Suggestions are disabled"),
        ("POST", "translate_file", 403, "Files translation are disabled"),
        ("GET", "translate", 405, "takes POST"),
        ("POST", "languages", 405, "takes GET"),
        ("GET", "nowhere", 404, "Not Found"),
    ],
)
def test_other_paths_get_libretranslate_errors_with_cors(
    server, method, path, status, said
) -> None:
    body = b"q=a" if method == "POST" else None
    req = urllib.request.Request(lt_url(server) + path, data=body, method=method)
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=TIMEOUT)
    with e.value as answer:
        assert answer.code == status and said in json.loads(answer.read())["error"]
        assert answer.headers["Access-Control-Allow-Origin"] == "*"


def test_html_the_parser_cannot_read_is_a_400(server) -> None:
    body = {"q": "a <![ b", "source": "en", "target": "de", "format": "html"}
    status, out = call(lt_url(server) + "translate", body)
    assert status == 400 and "not HTML that can be read" in out["error"]


def _multipart(fields: dict[str, str], files: dict[str, bytes] | None = None) -> tuple[bytes, str]:
    """(body, content type) of a multipart/form-data form, as a browser's FormData sends it."""
    boundary = "----transduce-test-boundary"
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
        for name, value in fields.items()
    ]
    for name, data in (files or {}).items():
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; '
            f'filename="{name}.txt"\r\nContent-Type: text/plain\r\n\r\n{data.decode()}\r\n'
        )
    body = ("".join(parts) + f"--{boundary}--\r\n").encode()
    return body, f"multipart/form-data; boundary={boundary}"


def test_multipart_forms_as_libretranslates_page_sends_them(server, translators) -> None:
    # LibreTranslate's own page posts a FormData (multipart); files are no endpoint's business
    url = lt_url(server) + "translate"
    text = "Grüße dog"
    fields = {"q": text, "source": "en", "target": "de", "format": "text", "api_key": ""}
    body, content_type = _multipart(fields)
    status, _, answer = _raw(url, body, {"Content-Type": content_type})
    assert status == 200, answer
    assert json.loads(answer)["translatedText"] == translators["en-de"].translate([text])[0]
    body, content_type = _multipart({"source": "en", "target": "de"}, {"q": b"a dog"})
    status, _, answer = _raw(url, body, {"Content-Type": content_type})
    assert status == 400 and "multipart form cannot be read" in json.loads(answer)["error"]


def test_repeated_slashes_are_merged_as_werkzeug_merges_them(server, keyed_server) -> None:
    # clients that join a base URL ending in / to /translate (Mastodon) send //translate
    body = {"q": "a dog", "source": "en", "target": "de"}
    status, out = call(server.url + "/libretranslate//translate", body)
    assert status == 200 and "translatedText" in out
    status, out = call(server.url + "//health", method="GET")
    assert status == 200
    # merged before the key is checked: no way around it through the slashes
    status, out = call(keyed_server.url + "//translate", {"text": ["a dog"]})
    assert status == 401


def test_alternatives_as_a_whole_json_number_with_a_fraction(server) -> None:
    body = {"q": "a dog", "source": "en", "target": "de", "alternatives": 2.0}
    status, out = call(lt_url(server) + "translate", body)
    assert status == 200 and isinstance(out["alternatives"], list)
    status, out = call(lt_url(server) + "translate", {**body, "alternatives": 1.5})
    assert status == 400 and "not a number" in out["error"]


def test_a_large_html_text_is_parsed_off_the_event_loop(
    translators, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the markup's parsing holds until /health has answered: on the event loop it would wait
    # for ever (the loop answers /health only once the parse returns)
    import threading

    import transduce.serve.libretranslate as lt

    answered = threading.Event()
    real = lt.split_html

    def slow_split(text: str):
        answered.wait(TIMEOUT)
        return real(text)

    monkeypatch.setattr(lt, "split_html", slow_split)
    with ServerThread(_app(translators)) as srv:
        result: list = []
        body = {"q": "<b>a dog</b>", "source": "en", "target": "de", "format": "html"}
        worker = threading.Thread(
            target=lambda: result.append(call(lt_url(srv) + "translate", body))
        )
        worker.start()
        try:
            time.sleep(0.2)  # the request is in the parse by now (if not, it only waits less)
            req = urllib.request.Request(srv.url + "/health")
            with urllib.request.urlopen(req, timeout=5) as resp:
                assert resp.status == 200
        finally:
            answered.set()
            worker.join(TIMEOUT)
        assert answered.is_set() and result[0][0] == 200


def test_the_libretranslate_routes_are_left_out_of_openapi(server) -> None:
    status, schema = call(server.url + "/openapi.json", method="GET")
    assert status == 200 and "/translate" in schema["paths"]
    assert not [p for p in schema["paths"] if p.startswith("/libretranslate")]


def test_max_request_chars_below_max_chars_is_refused(translators, capsys) -> None:
    from transduce.cli.main import main

    with pytest.raises(ValueError, match="max_request_chars .* must be at least max_chars"):
        replace(LIMITS, max_request_chars=LIMITS.max_chars - 1)
    model = str(translators["en-de.path"])
    serve = ["--no-malloc-tuning", "serve", "--port", "0", "--model", model]
    assert main([*serve, "--max-chars", "50", "--max-request-chars", "10"]) == 2
    assert "--max-request-chars (10) must be at least --max-chars (50)" in capsys.readouterr().err


def test_html_over_the_limits_is_refused_before_it_is_parsed(
    translators, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Python's HTML parser takes time quadratic in malformed markup ("<a" * 50,000: seconds):
    # the limits are checked on the raw text, before any parsing
    import transduce.serve.libretranslate as lt

    parsed: list[str] = []
    real = lt.split_html

    def spy(text: str):
        parsed.append(text)
        if len(text) > 100:
            raise AssertionError("parsed a text over the limits")  # (a 500: the test fails)
        return real(text)

    monkeypatch.setattr(lt, "split_html", spy)
    limits = replace(LIMITS, max_request_chars=1_000, max_html_chars=600)
    with ServerThread(
        create_app([ServedModel(translators["en-de"], "en", "de")], limits=limits)
    ) as srv:
        url, body = lt_url(srv) + "translate", {"source": "en", "target": "de", "format": "html"}
        status, out = call(url, {**body, "q": "<a" * 501})
        error = "Invalid request: request (1002 characters) exceeds text limit (1000 a request)"
        assert (status, out) == (400, {"error": error})
        for q in ("<a" * 350, ["<a " * 100, "<a " * 101]):  # over max_html_chars, in all
            status, out = call(url, {**body, "q": q})
            assert status == 400 and "exceeds the html limit (600 a request" in out["error"]
        assert parsed == []
        status, out = call(url, {**body, "q": "<b>a dog</b>"})
        want = f"<b>{translators['en-de'].translate(['a dog'])[0]}</b>"
        assert (status, out) == (200, {"translatedText": want}) and parsed == ["<b>a dog</b>"]
