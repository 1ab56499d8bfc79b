"""The page at ``GET /`` (transduce.serve.page) in a real browser: Debian's chromium driven by
Playwright's Python client (``executable_path``; no browser download), against the real server
on loopback with a tiny model. It types a sentence, translates (button and Ctrl+Enter), and
checks the translation (the Translator's own), the n-best list with scores, the attention heat
map, a server error shown as a message, the API key field; a screenshot is saved under tmp_path.

Skipped without /usr/bin/chromium unless CI is set (CI installs it: .ci/run), where it fails.
"""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail("CI is set but /usr/bin/chromium is missing (apt-get install chromium)")
    pytest.skip(
        "no /usr/bin/chromium (apt-get install chromium) and CI not set", allow_module_level=True
    )
sync_api = pytest.importorskip("playwright.sync_api")

from inference_testkit import save_toy_translation_model, toy_sentences  # noqa: E402

from transduce.inference.translator import Translator  # noqa: E402
from transduce.serve.guard import ApiKey  # noqa: E402
from transduce.serve.server import ServerThread, create_app  # noqa: E402

ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT_MS = 30_000


@pytest.fixture(scope="module")
def translator(tmp_path_factory) -> Translator:
    path = save_toy_translation_model(
        tmp_path_factory.mktemp("model") / "model.pt",
        {"max_len_offset": 4, "beam": 3, "alpha": 0.6},
    )
    return Translator.load(path)


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 390, "height": 844})  # a phone's width
    context.set_default_timeout(TIMEOUT_MS)
    pg = context.new_page()
    try:
        yield pg
    finally:
        context.close()


def test_page_is_served_as_html(translator) -> None:
    with (
        ServerThread(create_app(translator)) as srv,
        urllib.request.urlopen(srv.url + "/", timeout=30) as resp,
    ):
        html = resp.read().decode()
        assert resp.headers["Content-Type"].startswith("text/html")
    assert "<script>" in html and "http://" not in html and "https://" not in html  # no assets


def test_translate_nbest_and_heat_map(translator, page, tmp_path) -> None:
    sentence = toy_sentences(1, seed=5)[0]
    with ServerThread(create_app(translator)) as srv:
        page.goto(srv.url + "/")
        sync_api.expect(page.locator("#direction")).to_contain_text("languages not given")
        assert page.input_value("#beam") == "3" and page.input_value("#alpha") == "0.6"
        page.fill("#source", sentence)
        page.click("#translate")
        first = page.locator("ol.nbest li").first
        sync_api.expect(first.locator(".translation")).to_have_text(
            translator.translate([sentence])[0]
        )
        expected = translator.translate_nbest([sentence], 3)[0]
        items = page.locator("ol.nbest li")
        sync_api.expect(items).to_have_count(len(expected))
        assert page.locator("ol.nbest li .translation").all_text_contents() == [
            h.text for h in expected
        ]
        assert f"score {expected[0].score:.3f}" in first.locator(".score").text_content()
        # the best translation's attention is drawn: a row per target piece and EOS
        sync_api.expect(page.locator("#attention")).to_be_visible()
        n_target = len(translator.vocab.encode(expected[0].text)) + 1
        sync_api.expect(page.locator("#heatmap tbody tr")).to_have_count(n_target)
        n_source = len(translator.vocab.encode(sentence)) + 1
        assert page.locator("#heatmap tbody tr").first.locator("td").count() == n_source
        # another hypothesis chosen: its map
        items.nth(1).click()
        sync_api.expect(items.nth(1)).to_have_class("chosen")
        n_second = len(translator.vocab.encode(expected[1].text)) + 1
        sync_api.expect(page.locator("#heatmap tbody tr")).to_have_count(n_second)
        sync_api.expect(page.locator("#error")).to_be_empty()
        # usable at a phone's width: nothing wider than the screen (the heat map scrolls alone)
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        shot = page.screenshot(path=str(tmp_path / "page.png"), full_page=True)
        assert shot[:8] == b"\x89PNG\r\n\x1a\n"
        # Ctrl+Enter with other settings: beam 1, the greedy translation, one of it
        page.fill("#beam", "1")
        other = toy_sentences(1, seed=6)[0]
        page.fill("#source", other)
        page.press("#source", "Control+Enter")
        greedy = translator.translate([other], translator.decode_config(beam=1))[0]
        sync_api.expect(page.locator("ol.nbest li .translation")).to_have_text([greedy])


def test_a_server_error_is_shown_as_a_message(translator, page) -> None:
    with ServerThread(create_app(translator)) as srv:
        page.goto(srv.url + "/")
        page.fill("#source", "a dog")
        page.fill("#beam", "99")  # over the server's max_beam: a 422
        page.click("#translate")
        sync_api.expect(page.locator("#error")).to_contain_text("error 422: 'beam' must be")
        sync_api.expect(page.locator("#translate")).to_be_enabled()
    page.fill("#beam", "2")
    page.click("#translate")  # the server is gone
    sync_api.expect(page.locator("#error")).to_contain_text("cannot reach the server")


def test_with_an_api_key_the_page_sends_it(translator, page) -> None:
    app = create_app(translator, api_key=ApiKey("s3cret-token"))
    with ServerThread(app) as srv:
        page.goto(srv.url + "/")  # open without the key
        page.fill("#source", "a dog")
        page.click("#translate")
        sync_api.expect(page.locator("#error")).to_contain_text("error 401")
        page.fill("#key", "s3cret-token")
        page.click("#translate")
        sync_api.expect(page.locator("ol.nbest li .translation").first).to_have_text(
            translator.translate(["a dog"])[0]
        )
        sync_api.expect(page.locator("#error")).to_be_empty()
        sync_api.expect(page.locator("#heatmap tbody tr").first).to_be_visible()


def test_the_recurrent_model_and_a_small_max_beam_translate_without_an_error(
    translator, page, tmp_path
) -> None:
    # no attention request for the recurrent baseline (it has no maps: a 422 each time), and the
    # model's beam 3 opens as 2 where the server's max_beam is 2
    from dataclasses import replace

    from transduce.serve.server import ServerLimits

    rnn = Translator.load(
        save_toy_translation_model(
            tmp_path / "rnn.pt", {"max_len_offset": 4, "beam": 3}, {"architecture": "rnn"}
        )
    )
    for model, limits in ((rnn, ServerLimits()), (translator, replace(ServerLimits(), max_beam=2))):
        with ServerThread(create_app(model, limits=limits)) as srv:
            page.goto(srv.url + "/")
            expected_beam = str(min(3, limits.max_beam))
            sync_api.expect(page.locator("#beam")).to_have_value(expected_beam)
            page.fill("#source", "a dog")
            page.click("#translate")
            sync_api.expect(page.locator("ol.nbest li").first).to_be_visible()
            page.wait_for_timeout(300)  # an attention answer, if any, would be in by then
            sync_api.expect(page.locator("#error")).to_be_empty()
            assert page.locator("#attention").is_hidden() == (model is rnn)


class _UnderPrefix:
    """What a reverse proxy serving the app under /mt/ does: /mt/... reaches it without the
    prefix, anything else gets a 404 (and the app's lifespan still runs)."""

    def __init__(self, app, prefix: str = "/mt") -> None:
        self.app, self.prefix = app, prefix
        self.state = app.state  # the server's limits, for uvicorn_server

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
        elif scope["path"].startswith(self.prefix + "/"):
            scope = {**scope, "path": scope["path"][len(self.prefix) :], "raw_path": None}
            await self.app(scope, receive, send)
        else:
            from starlette.responses import PlainTextResponse

            await PlainTextResponse("not here", status_code=404)(scope, receive, send)


def test_the_page_works_behind_a_proxy_that_serves_it_under_a_prefix(translator, page) -> None:
    with ServerThread(_UnderPrefix(create_app(translator))) as srv:  # type: ignore[arg-type]
        page.goto(srv.url + "/mt/")
        sync_api.expect(page.locator("#beam")).to_have_value("3")  # /health read
        page.fill("#source", "a dog")
        page.click("#translate")
        sync_api.expect(page.locator("ol.nbest li .translation").first).to_have_text(
            translator.translate(["a dog"])[0]
        )
        sync_api.expect(page.locator("#heatmap tbody tr").first).to_be_visible()  # /attention
        sync_api.expect(page.locator("#error")).to_be_empty()


def test_a_model_that_samples_is_sampled_until_a_beam_is_set(page, tmp_path) -> None:
    """The page sent the model's beam always, so a model whose config samples was searched from
    the page while the server's own default samples; it samples now, and searches once a beam is
    set, as the server does."""
    sampler = Translator.load(
        save_toy_translation_model(
            tmp_path / "sampler.pt", {"sampling": True, "beam": 3, "temperature": 2.0}
        )
    )
    with ServerThread(create_app(sampler)) as srv:
        page.goto(srv.url + "/")
        sync_api.expect(page.locator("#direction")).to_contain_text("samples (temperature 2")
        page.fill("#source", "a dog")
        with page.expect_request("**/translate") as asked:
            page.click("#translate")
        assert asked.value.post_data_json == {"text": ["a dog"]}
        sync_api.expect(page.locator("ol.nbest li").first).to_be_visible()
        sync_api.expect(page.locator("#error")).to_be_empty()
        page.fill("#beam", "2")
        with page.expect_request("**/translate") as asked:
            page.click("#translate")
        body = asked.value.post_data_json
        assert (body["beam"], body["nbest"]) == (2, 2)
        page.wait_for_timeout(300)
        sync_api.expect(page.locator("#error")).to_be_empty()
