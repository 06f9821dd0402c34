"""The page of `vitkit serve` in a real headless Chromium (Debian's chromium + chromedriver, selenium 4): upload
a real image through the file input, see the predicted label with its bar and the attention overlay. The
screenshot is kept as a test artifact (its path is printed; docs/figures/serve-page.png is a copy)."""
from __future__ import annotations

import contextlib
import io
import secrets
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import vitkit
from vitkit.data import fashion_mnist
from vitkit.inference import predict_files
from vitkit.serve import create_app

CHROMIUM, DRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM.exists() and DRIVER.exists()),
                                reason="needs Debian's chromium and chromium-driver (make setup installs them as root)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(app):
    """uvicorn serving `app` on a free loopback port, in a thread of this process; yields its URL."""
    import uvicorn

    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(timeout=30)


@pytest.fixture(scope="module")
def model():
    return vitkit.load_model("bundled:fashion-mnist").eval()


@pytest.fixture(scope="module")
def server(model):
    """The bundled model served without a key."""
    with serving(create_app(model, name="bundled:fashion-mnist")) as url:
        yield url, model


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", "--window-size=1100,640",
                f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(DRIVER)), options=opts)
    yield driver
    driver.quit()


def shoe_image(path: Path) -> Path:
    """A real Fashion-MNIST test image (what the bundled model knows), else a real photo, as a PNG file."""
    if fashion_mnist.find_local() is not None:
        images, _ = fashion_mnist.load(allow_download=False)["test"]
        array = images[0, 0].numpy()  # [28, 28] uint8
    else:
        from skimage import data

        array = data.camera()[::4, ::4]
    Image.fromarray(array).resize((112, 112), Image.NEAREST).save(path)
    return path


def test_page_uploads_an_image_and_shows_label_bars_and_overlay(server, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    url, model = server
    image = shoe_image(tmp_path / "upload.png")
    expected = predict_files(model, [image], top_k=5)[0][0]["top"]  # what `vitkit predict` says for this file

    browser.get(url + "/")
    wait = WebDriverWait(browser, 30)
    wait.until(EC.text_to_be_present_in_element((By.ID, "model"), "bundled:fashion-mnist"))
    browser.find_element(By.ID, "file").send_keys(str(image))
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#top .bar-row")) == 5)
    labels = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#top .label")]
    probs = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#top .prob")]
    assert labels == [t["label"] for t in expected]
    assert probs == [f"{100 * t['prob']:.1f}%" for t in expected]
    wait.until(lambda d: d.execute_script(
        "const o = document.getElementById('overlay'); return o.complete && o.naturalWidth > 0 && "
        "!document.getElementById('overlay-box').classList.contains('hidden');"))
    assert expected[0]["label"] in browser.find_element(By.ID, "status").text
    assert "error" not in browser.find_element(By.ID, "status").get_attribute("class")

    shot = tmp_path / "serve-page.png"
    assert browser.save_screenshot(str(shot))
    with Image.open(io.BytesIO(shot.read_bytes())) as im:
        pixels = np.asarray(im.convert("RGB"), dtype=np.float32)
    assert pixels.std() > 20, "the screenshot is blank"
    print(f"\nscreenshot: {shot}")  # pytest keeps the last runs' tmp folders


def test_page_shows_the_servers_error_for_a_bad_file(server, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    url, _ = server
    bad = tmp_path / "notes.png"
    bad.write_text("this is not a picture\n")
    browser.get(url + "/")
    browser.find_element(By.ID, "file").send_keys(str(bad))
    status = browser.find_element(By.ID, "status")
    WebDriverWait(browser, 30).until(lambda d: "error" in status.get_attribute("class"))
    assert "not an image" in status.text and "notes.png" in status.text
    # the browser cannot show the file either: no broken-image icon in its place
    WebDriverWait(browser, 10).until(lambda d: d.execute_script("return document.getElementById('preview').complete"))
    assert broken_images(browser) == []


def broken_images(browser) -> list[str]:
    """The ids of the <img> elements that are on screen but show no picture (the browser's broken-image icon
    with the alt text)."""
    return browser.execute_script(
        "return [...document.images].filter((im) => im.getClientRects().length > 0 && "
        "getComputedStyle(im).visibility !== 'hidden' && !(im.complete && im.naturalWidth > 0))"
        ".map((im) => im.id || im.alt);")


def test_page_shows_no_broken_image_icon_before_an_image(server, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    url, _ = server
    browser.get(url + "/")
    WebDriverWait(browser, 30).until(EC.text_to_be_present_in_element((By.ID, "model"), "bundled:fashion-mnist"))
    assert broken_images(browser) == []
    assert browser.find_elements(By.CSS_SELECTOR, "img") != []  # the images are there, only hidden
    browser.find_element(By.ID, "file").send_keys(str(shoe_image(tmp_path / "upload.png")))
    WebDriverWait(browser, 30).until(lambda d: d.find_element(By.ID, "preview").is_displayed())
    assert broken_images(browser) == []


def test_page_asks_for_the_key_once_and_sends_it_on_every_call(model, browser, tmp_path):
    """A server with a key: the page asks for it when the first call gets 401 (a wrong key is refused and
    asked again), then classifies and explains with it, and keeps it for the tab's session (a reload does
    not ask again)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    key = secrets.token_urlsafe(32)
    image = shoe_image(tmp_path / "upload.png")
    expected = predict_files(model, [image], top_k=5)[0][0]["top"]
    with serving(create_app(model, name="bundled:fashion-mnist", api_keys=[key])) as url:
        browser.get(url + "/")
        browser.execute_script("sessionStorage.clear();")
        browser.refresh()
        wait = WebDriverWait(browser, 30)
        wait.until(EC.visibility_of_element_located((By.ID, "key")))
        assert "key" in browser.find_element(By.ID, "key-message").text.lower()
        assert browser.find_element(By.ID, "key").get_attribute("type") == "password"

        field = browser.find_element(By.ID, "key")
        field.send_keys(secrets.token_urlsafe(32))
        browser.find_element(By.ID, "key-submit").click()
        wait.until(EC.text_to_be_present_in_element((By.ID, "key-message"), "wrong"))
        assert browser.find_element(By.ID, "key").is_displayed()

        field.clear()
        field.send_keys(key)
        browser.find_element(By.ID, "key-submit").click()
        wait.until(EC.text_to_be_present_in_element((By.ID, "model"), "bundled:fashion-mnist"))
        assert not browser.find_element(By.ID, "key").is_displayed()
        browser.find_element(By.ID, "file").send_keys(str(image))
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#top .bar-row")) == 5)
        labels = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#top .label")]
        assert labels == [t["label"] for t in expected]
        wait.until(lambda d: d.execute_script(  # explain is a second call with the key
            "const o = document.getElementById('overlay'); return o.complete && o.naturalWidth > 0 && "
            "!document.getElementById('overlay-box').classList.contains('hidden');"))
        assert "error" not in browser.find_element(By.ID, "status").get_attribute("class")

        browser.refresh()  # the same tab: the key is remembered, nothing is asked
        wait.until(EC.text_to_be_present_in_element((By.ID, "model"), "bundled:fashion-mnist"))
        assert not browser.find_element(By.ID, "key").is_displayed()
        browser.execute_script("sessionStorage.clear();")
