"""The attention explorer (vanilla_transformer.explorer): its work without the page, then the page itself, served
on 127.0.0.1 and driven in headless Chromium (the system's browser, through playwright), with every request
that is not to 127.0.0.1 blocked and counted. The `explore` command is tested in test_cli.py."""

import io
import os
import shutil
import socket
import urllib.request

import pytest
import torch
from conftest import EOS, SENTENCES, SOURCE, tiny_model

pytest.importorskip("matplotlib")

from vanilla_transformer.evaluation import translate  # noqa: E402
from vanilla_transformer.explorer import (  # noqa: E402
    MAX_BEAMS,
    MAX_SOURCE_CHARACTERS,
    MAX_SOURCE_TOKENS,
    Explorer,
    translate_candidates,
)
from vanilla_transformer.tokenization import train_joint_bpe  # noqa: E402

LOCAL_HOSTS = ("127.0.0.1", "::1", "localhost")


@pytest.fixture
def explorer(tmp_path):
    explorer = Explorer(picture_dir=tmp_path / "pictures")
    yield explorer
    explorer.close()


def pixels(png: bytes | os.PathLike) -> torch.Tensor:
    import numpy as np
    from PIL import Image

    with Image.open(io.BytesIO(png) if isinstance(png, bytes) else png) as image:
        return torch.from_numpy(np.array(image.convert("RGB")))


# ------------------------------------------------------------------ the work, without the page
def test_the_explorer_shows_translate_output_and_the_beams_candidates(saved, explorer):
    model, tokenizer = explorer.load(saved)
    result = explorer.translate(saved, f"  {SOURCE} ", num_beams=3, length_penalty=1.0)
    assert result["source"] == SOURCE
    assert result["translation"] == translate(model, tokenizer, [SOURCE], num_beams=3, length_penalty=1.0)[0]
    candidates = result["candidates"]
    assert len(candidates) == 3 and candidates[0]["text"] == result["translation"]
    assert [c["score"] for c in candidates] == sorted((c["score"] for c in candidates), reverse=True)
    rows = explorer.candidate_rows(result)
    assert [row[:2] for row in rows] == [[rank, c["text"]] for rank, c in enumerate(candidates, start=1)]
    assert len(rows[0][4].split("  ")) == candidates[0]["length"]  # one "token probability" per generated token

    greedy = explorer.translate(saved, SOURCE, num_beams=3, length_penalty=1.0, greedy=True)
    assert greedy["num_beams"] == 1 and len(greedy["candidates"]) == 1
    assert (
        greedy["translation"]
        == translate(model, tokenizer, [SOURCE], num_beams=1)[0]
        == greedy["candidates"][0]["text"]
    )
    default = explorer.translate(saved, SOURCE)  # the model's own decoding: beam 4
    assert default["num_beams"] == model.generation_config.num_beams == len(default["candidates"])


def test_each_head_gets_its_own_picture_and_maps_are_computed_once_per_layer(saved, explorer, monkeypatch):
    result = explorer.translate(saved, SOURCE, num_beams=2)
    every_head = explorer.draw(result, "cross", 1)
    head0, head1 = explorer.draw(result, "cross", 1, head="0"), explorer.draw(result, "cross", 1, head=1)
    assert len({every_head, head0, head1}) == 3 and all(p.read_bytes()[:4] == b"\x89PNG" for p in (every_head, head1))
    assert not torch.equal(pixels(head0), pixels(head1))  # another head, another picture
    assert torch.equal(pixels(head1), pixels(explorer.draw(result, "cross", 1, head=1)))  # the same head again
    maps = result["maps"][1]
    assert maps["target"] == result["translation"]  # the maps are those of the translation shown
    assert maps["cross"].shape == (4, len(maps["output_tokens"]), len(maps["source_tokens"]))

    calls = []
    monkeypatch.setattr("vanilla_transformer.explorer.attention_maps", lambda *a, **k: calls.append(k) or maps)
    explorer.draw(result, "encoder", 1, head=2)  # layer 1's maps are kept: no new forward pass
    explorer.draw(result, "decoder", 0)
    assert [call["layer"] for call in calls] == [0] and calls[0]["num_beams"] == 2


def test_a_model_with_head_dim_is_described_and_drawn_head_by_head(tmp_path, explorer):
    """Heads of head_dim 12 (3 in the encoder, 5 in the decoder: h·d_k ≠ d_model): one map per head of each kind."""
    tokenizer = train_joint_bpe(SENTENCES * 3, vocab_size=400, min_frequency=1)
    model = tiny_model(vocab_size=len(tokenizer), encoder_attention_heads=3, decoder_attention_heads=5, head_dim=12)
    model.generation_config.source_length_offset = 6
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    assert "2 encoder and 2 decoder layers, 3 heads of size 12, d_model 32" in explorer.describe(tmp_path / "model")
    result = explorer.translate(tmp_path / "model", SOURCE, num_beams=2)
    assert explorer.draw(result, "cross", 1, head=4).read_bytes()[:4] == b"\x89PNG"
    maps = result["maps"][1]
    assert maps["encoder"].shape[0] == 3 and maps["decoder"].shape[0] == maps["cross"].shape[0] == 5
    assert torch.allclose(maps["cross"].sum(-1), torch.ones(maps["cross"].shape[:2]), atol=1e-5)


@pytest.mark.parametrize(
    "text, message",
    [
        ("", r"source box is empty"),
        ("   \n ", r"source box is empty"),
        (
            "a" * (MAX_SOURCE_CHARACTERS + 1),
            rf"{MAX_SOURCE_CHARACTERS + 1} characters; .*at most {MAX_SOURCE_CHARACTERS}",
        ),
        ("x " * MAX_SOURCE_TOKENS, rf"has \d{{3}} sub-word tokens; .*at most .* {MAX_SOURCE_TOKENS} sub-word tokens"),
    ],
)
def test_a_source_out_of_bounds_is_a_clear_error(saved, explorer, text, message):
    with pytest.raises(ValueError, match=message):
        explorer.translate(saved, text)


@pytest.mark.parametrize(
    "beams, alpha, message",
    [
        (0, None, rf"whole number from 1 to {MAX_BEAMS}"),
        (MAX_BEAMS + 1, None, "from 1 to"),
        (2.5, None, "whole number"),
        (2, float("nan"), "must be a number"),
        (2, "0.6", "must be a number"),
    ],
)
def test_bad_decoding_settings_are_a_clear_error(beams, alpha, message):
    with pytest.raises(ValueError, match=message):
        Explorer.decoding(beams, alpha)
    assert Explorer.decoding(4.0, 0.6) == (4, 0.6) and Explorer.decoding(4, 0.6, greedy=True) == (1, None)


def test_a_folder_that_holds_no_model_is_a_clear_error(tmp_path, explorer):
    (tmp_path / "empty").mkdir()
    for folder, message in (
        (tmp_path / "nowhere", "There is no folder"),
        (tmp_path / "empty", "no config.json"),
        ("  ", "model folder is empty"),
    ):
        with pytest.raises(ValueError, match=message) as error:
            explorer.load(folder)
        assert "vanilla-transformer train" in str(error.value)  # and what to give instead


# ------------------------------------------------------------------ translate_candidates, with a real tokenizer
def teacher_forced_log_probabilities(model, tokenizer, source: str, ids: list[int]) -> torch.Tensor:
    """log p(y_t | y_<t, x) of each token of ``ids`` under the model, from one forward pass."""
    input_ids = tokenizer([source], return_tensors="pt")["input_ids"]
    decoder_input_ids = torch.tensor([[model.config.decoder_start_token_id, *ids[:-1]]])
    with torch.no_grad():
        log_probs = model(input_ids=input_ids, decoder_input_ids=decoder_input_ids).logits[0].log_softmax(-1)
    return log_probs[torch.arange(len(ids)), ids]


def test_translate_candidates_are_the_beams_hypotheses_ranked_by_length_normalised_log_probability(
    tokenizer, valid_sentences
):
    model, source = tiny_model(seed=0, vocab_size=len(tokenizer)), valid_sentences["en"][3]
    # An untrained model repeats one token and never stops: give </s> almost that token's embedding (tied to the
    # output layer), so that beam search finishes candidates of several lengths.
    greedy = translate_candidates(model, tokenizer, source, num_beams=1, max_new_tokens=12)[0]
    repeated = max(set(greedy["token_ids"]), key=greedy["token_ids"].count)
    with torch.no_grad():
        model.model.shared.weight[EOS] = 0.999 * model.model.shared.weight[repeated]

    best_lengths = {}
    for alpha in (0.0, 0.6, 2.0):
        candidates = translate_candidates(
            model, tokenizer, source, num_beams=4, length_penalty=alpha, max_new_tokens=12
        )
        assert len(candidates) == 4
        assert (
            candidates[0]["text"]
            == translate(model, tokenizer, [source], num_beams=4, length_penalty=alpha, max_new_tokens=12)[0]
        )
        scores = [c["score"] for c in candidates]
        assert scores == sorted(scores, reverse=True)
        for c in candidates:
            assert c["length"] == len(c["token_ids"]) == len(c["tokens"]) == len(c["token_log_probabilities"])
            assert c["tokens"] == tokenizer.convert_ids_to_tokens(c["token_ids"])
            assert c["text"] == tokenizer.decode(c["token_ids"], skip_special_tokens=True)
            # transformers' score: the summed log-probabilities over length ** alpha (</s> counted, <s> not)
            assert c["score"] == pytest.approx(c["log_probability"] / c["length"] ** alpha, rel=1e-5)
            expected = teacher_forced_log_probabilities(model, tokenizer, source, c["token_ids"])
            torch.testing.assert_close(torch.tensor(c["token_log_probabilities"]), expected, rtol=0, atol=1e-4)
            assert c["log_probability"] == pytest.approx(float(expected.sum()), abs=1e-3)
        if alpha == 0.6:
            assert len({c["length"] for c in candidates}) > 1 and candidates[0]["token_ids"][-1] == EOS
            two = translate_candidates(
                model, tokenizer, source, num_beams=4, length_penalty=alpha, num_return_sequences=2, max_new_tokens=12
            )
            assert [c["token_ids"] for c in two] == [c["token_ids"] for c in candidates[:2]]
        best_lengths[alpha] = candidates[0]["length"]
    assert best_lengths[2.0] > best_lengths[0.0]  # a larger α favours longer candidates

    (only,) = translate_candidates(model, tokenizer, source, num_beams=1, max_new_tokens=12)
    assert only["text"] == translate(model, tokenizer, [source], num_beams=1, max_new_tokens=12)[0]
    assert only["score"] == only["log_probability"]  # greedy decoding has no length penalty


def test_translate_candidates_errors(tokenizer):
    mt_model = tiny_model(seed=0, vocab_size=len(tokenizer))
    with pytest.raises(ValueError, match="one non-empty sentence"):
        translate_candidates(mt_model, tokenizer, "  ")
    with pytest.raises(ValueError, match="one non-empty sentence"):
        translate_candidates(mt_model, tokenizer, ["Hello."])
    with pytest.raises(ValueError, match=r"num_return_sequences must be an integer from 1 to num_beams=4.*got 5"):
        translate_candidates(mt_model, tokenizer, "Hello.", num_beams=4, num_return_sequences=5)
    with pytest.raises(ValueError, match="num_beams must be a positive integer"):
        translate_candidates(mt_model, tokenizer, "Hello.", num_beams=0)
    with pytest.raises(ValueError, match="Tokenizer and model config do not match"):
        translate_candidates(tiny_model(), tokenizer, "Hello.")


# ------------------------------------------------------------------ the page, in a real browser
def chromium_path() -> str:
    for name in ("chromium", "chromium-browser"):
        if shutil.which(name):
            return shutil.which(name)
    pytest.skip(
        "Chromium is not installed: scripts/setup.sh installs Debian's `chromium` with apt where it can "
        "(as root or with passwordless sudo); or run: sudo apt-get install chromium"
    )


@pytest.fixture
def no_connections_out(monkeypatch):
    """Sockets of this process (the app's server) may connect to this machine only; others are refused and recorded."""
    refused, connect = [], socket.socket.connect

    def local_only(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in LOCAL_HOSTS:
            refused.append(address)
            raise ConnectionRefusedError(f"the test lets nothing leave the machine: {address}")
        return connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", local_only)
    return refused


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning:gradio.queueing")  # pandas 3 deprecations inside gradio
def test_the_page_in_a_browser_translates_and_shows_each_heads_attention(saved, tmp_path, no_connections_out):
    executable = chromium_path()
    sync_api = pytest.importorskip("playwright.sync_api")
    pytest.importorskip("gradio")
    from vanilla_transformer.explorer import launch

    explorer = Explorer(picture_dir=tmp_path / "pictures")
    app, url, _ = launch(saved, host="127.0.0.1", block=False, quiet=True, explorer=explorer)
    blocked, local = [], []

    def only_this_machine(route):
        host = route.request.url.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0]
        if route.request.url.startswith(("http://", "https://", "ws://", "wss://")) and host == "127.0.0.1":
            local.append(route.request.url)
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    def image_bytes(page) -> bytes:
        source = page.locator("#heatmap img").first.get_attribute("src")
        assert source.startswith(url), source
        with urllib.request.urlopen(source, timeout=30) as response:
            return response.read()

    try:
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=executable, headless=True, args=["--no-sandbox"] if os.geteuid() == 0 else []
            )
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.route("**/*", only_this_machine)
            page.goto(url)
            expect = sync_api.expect
            message, translation = page.locator("#message"), page.locator("#translation textarea")
            expect(page.locator("#source")).to_contain_text(f"At most {MAX_SOURCE_CHARACTERS} characters")

            # bad input: a message in the page, never a stack trace
            page.locator("#translate").click()
            expect(message).to_contain_text("source box is empty", timeout=60_000)
            page.locator("#source textarea").fill("a" * (MAX_SOURCE_CHARACTERS + 1))
            page.locator("#translate").click()
            expect(message).to_contain_text(f"at most {MAX_SOURCE_CHARACTERS} characters", timeout=60_000)
            page.locator("#model-folder textarea").fill(str(tmp_path / "not-a-model"))
            page.locator("#load").click()
            expect(message).to_contain_text("There is no folder", timeout=60_000)
            expect(message).to_contain_text("The page still shows the model in")
            assert "Traceback" not in page.content()
            page.locator("#model-folder textarea").fill(str(saved))
            page.locator("#load").click()
            expect(message).to_have_text("", timeout=60_000)
            expect(page.locator("#model-info")).to_contain_text("2 encoder and 2 decoder layers, 4 heads")

            # a sentence: the translation is translate()'s, with the page's decoding (beam 4, α 0.6: the model's)
            page.locator("#source textarea").fill(SOURCE)
            page.locator("#translate").click()
            model, tokenizer = explorer.load(saved)
            expected = translate(model, tokenizer, [SOURCE])[0]
            expect(translation).to_have_value(expected, timeout=60_000)
            expect(message).to_have_text("")
            expect(page.locator("#candidates")).to_contain_text(expected)
            expect(page.locator("#heatmap img").first).to_be_visible(timeout=60_000)
            page.screenshot(path=tmp_path / "translated.png", full_page=True)
            every_head = image_bytes(page)

            # another head: another picture, the one the explorer draws for that head
            page.locator("#head label").filter(has_text="head 1").click()
            page.wait_for_function(
                "src => document.querySelector('#heatmap img').getAttribute('src') !== src",
                arg=page.locator("#heatmap img").first.get_attribute("src"),
                timeout=60_000,
            )
            head1 = image_bytes(page)
            page.screenshot(path=tmp_path / "head-1.png", full_page=True)
            result = explorer.translate(saved, SOURCE)
            assert not torch.equal(pixels(every_head), pixels(head1))
            assert torch.equal(pixels(head1), pixels(explorer.draw(result, "cross", 1, head=1)))
            assert torch.equal(pixels(every_head), pixels(explorer.draw(result, "cross", 1)))
            browser.close()
    finally:
        app.close()
        explorer.close()

    assert local, "the page made no request to the app"
    assert blocked == [], f"the page asked for something outside this machine: {blocked}"
    assert no_connections_out == []
    assert (tmp_path / "translated.png").stat().st_size > 0 and (tmp_path / "head-1.png").stat().st_size > 0
