"""The built site in headless Chromium (Debian's chromium and chromium-driver): pages render with
their code blocks, and the search finds ModelCheckpoint.

The site is served on 127.0.0.1 by a server this test starts, since the search runs in a web
worker that browsers do not start from file:// pages.
"""

from __future__ import annotations

import functools
import http.server
import shutil
import threading

import pytest

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as ec  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="needs Debian's chromium and chromium-driver (.ci/run installs them)")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # one line per request would bury a failure's output
        pass


@pytest.fixture(scope="module")
def served(site):
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def _visible_code_blocks(browser) -> list[str]:
    blocks = browser.find_elements(By.CSS_SELECTOR, "article .highlight pre code")
    return [b.text for b in blocks if b.is_displayed() and b.size["height"] > 0]


def test_the_home_page_renders_with_its_code_blocks(browser, served):
    browser.get(f"{served}/index.html")
    assert browser.find_element(By.CSS_SELECTOR, "article h1").text == "fitjax"
    code = _visible_code_blocks(browser)
    assert any("class Classifier(fj.LitModule):" in c and "trainer.fit(module, train, val)" in c for c in code), code
    assert browser.find_element(By.CSS_SELECTOR, "article table").is_displayed()


def test_the_model_checkpoint_page_renders_its_signature_arguments_and_example(browser, served):
    browser.get(f"{served}/reference/fitjax.ModelCheckpoint.html")
    article = browser.find_element(By.CSS_SELECTOR, "article")
    assert "fitjax.ModelCheckpoint" in article.find_element(By.CSS_SELECTOR, "h1").text
    assert "every_n_train_steps" in article.find_element(By.CSS_SELECTOR, ".doc-signature").text
    assert "save_top_k" in article.find_element(By.CSS_SELECTOR, "table").text
    assert any("fj.ModelCheckpoint(" in c for c in _visible_code_blocks(browser))  # the docstring's example


def test_the_search_finds_model_checkpoint(browser, served):
    browser.get(f"{served}/index.html")
    box = WebDriverWait(browser, 20).until(ec.element_to_be_clickable((By.CSS_SELECTOR, "input.md-search__input")))
    box.click()
    box.send_keys("ModelCheckpoint")
    # the results are re-drawn as the search runs: a link read while it is replaced is stale, and
    # the wait tries again
    WebDriverWait(browser, 30, ignored_exceptions=(StaleElementReferenceException,)).until(
        lambda b: any("fitjax.ModelCheckpoint" in (a.get_attribute("href") or "")
                      for a in b.find_elements(By.CSS_SELECTOR, ".md-search-result__link")))
