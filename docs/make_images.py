"""Makes the site's pictures from real runs of examples/digits.py; run from the repository root.

    python docs/make_images.py                  # all of them, into docs/images/ (~1-2 min on 2 cores)
    python docs/make_images.py --only lr_find   # one: progress, tensorboard, lr_find or metrics

- `progress.svg`: a 4-epoch digits run in a real terminal (tmux), its screen as SVG (rich);
- `tensorboard_scalars.png`, `tensorboard_hparams.png`: TensorBoard, started here on 127.0.0.1
  over that fit's logs, screenshotted by headless Chromium (Debian's chromium and chromedriver);
- `lr_find.png`: `Tuner.lr_find` on the same module, its `plot(suggest=True)`;
- `metrics_f1.png`, `metrics_confusion.png`: `examples/imbalanced_digits.py`'s macro F1 and AUROC
  curves and its last confusion matrix, in TensorBoard as above.

Needs `pip install -e ".[dev]"` (TensorBoard, matplotlib, selenium) and chromium. Nothing is
drawn by hand: rerun it after a change to the bar, the logger or the tuner.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs" / "images"
sys.path.insert(0, str(ROOT / "examples"))

import digits  # noqa: E402  (examples/digits.py: the module and data the pictures show)
import optax  # noqa: E402

import fitjax as fj  # noqa: E402


def _digits_run(root: Path, epochs: int, bar: fj.RichProgressBar | None) -> fj.Trainer:
    train, val = digits.digits_splits()
    train_loader = fj.DataLoader(train, batch_size=64, shuffle=True, drop_last=True)
    module = digits.DigitsClassifier(total_steps=epochs * len(train_loader))
    trainer = fj.Trainer(max_epochs=epochs, default_root_dir=str(root), log_every_n_steps=5,
                         enable_model_summary=False, enable_progress_bar=bar is not None,
                         callbacks=[bar] if bar is not None else None)
    trainer.fit(module, train_loader, fj.DataLoader(val, batch_size=128))
    return trainer


def progress(root: Path) -> None:
    """A 4-epoch `examples/digits.py` in a real terminal (tmux, 100 x 40), its screen captured with
    colours and turned into SVG by rich."""
    from rich.console import Console
    from rich.text import Text

    tmux = ["tmux", "-L", f"fitjax-docs-{os.getpid()}"]  # a server of our own, ended below
    # from the run's folder: the logs line reads runs/fitjax_logs/...
    command = (f"cd {root} && PYTHONPATH={ROOT} {sys.executable} {ROOT}/examples/digits.py "
               "--epochs 4; echo DONE; sleep 60")
    subprocess.run([*tmux, "new-session", "-d", "-x", "100", "-y", "40", command], check=True)
    try:
        screen = ""
        for _ in range(600):
            time.sleep(0.5)
            screen = subprocess.run([*tmux, "capture-pane", "-p", "-e", "-S", "-60"], check=True,
                                    capture_output=True, text=True).stdout
            if "DONE" in screen:
                break
        else:
            raise RuntimeError(f"digits did not finish in 5 minutes; the screen:\n{screen}")
    finally:
        subprocess.run([*tmux, "kill-server"], check=False)
    lines = screen.split("\n")
    lines = lines[: next(i for i, ln in enumerate(lines) if "DONE" in ln)]
    console = Console(record=True, width=100, file=io.StringIO(), force_terminal=True, color_system="truecolor")
    console.print(Text.from_ansi("\n".join(lines).rstrip()), soft_wrap=True)
    (IMAGES / "progress.svg").write_text(console.export_svg(title="python examples/digits.py --epochs 4"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _browser(width: int = 1100, height: int = 700):
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", f"--window-size={width},{height}"):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(shutil.which("chromedriver")))


@contextlib.contextmanager
def _tensorboard_browser(logdir: Path, width: int = 1500, height: int = 900):
    """A TensorBoard on 127.0.0.1 over `logdir` and a headless browser; yields (browser, its URL)."""
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1",
         "--port", str(port), "--reload_interval", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    browser = _browser(width, height)
    try:
        for _ in range(120):  # TensorBoard takes a few seconds to start and read the files
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.5)
        yield browser, f"http://127.0.0.1:{port}"
    except Exception:
        browser.save_screenshot("/tmp/make_images_failed.png")  # what the browser showed
        raise
    finally:
        browser.quit()
        server.terminate()
        server.wait(timeout=30)


def _time_series(browser, url: str, tags: str, image: str) -> None:
    """TensorBoard's time series of the tags matching the regex `tags`, screenshotted to `image`."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{url}/#timeseries")
    box = WebDriverWait(browser, 90).until(lambda b: b.find_element(By.CSS_SELECTOR, "input[placeholder^='Filter tags']"))
    box.send_keys(tags)
    for close in browser.find_elements(By.CSS_SELECTOR, "button[aria-label='Close side pane']"):
        close.click()  # the settings pane would cover the third column of charts
    WebDriverWait(browser, 90).until(
        lambda b: b.find_elements(By.XPATH, "//*[contains(text(), 'Tags matching filter')]"))
    time.sleep(4)  # the charts draw after their cards appear
    browser.save_screenshot(str(IMAGES / image))


def tensorboard(root: Path) -> None:
    """TensorBoard's scalars and HPARAMS tabs over a digits fit's event files."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    _digits_run(root, epochs=8, bar=None)
    with _tensorboard_browser(root) as (browser, url):
        _time_series(browser, url, "^(train|val)/", "tensorboard_scalars.png")  # not epoch or lr
        browser.get(f"{url}/#hparams")
        WebDriverWait(browser, 90).until(lambda b: "val/acc" in b.find_element(By.TAG_NAME, "body").text)
        time.sleep(3)  # the columns TensorBoard ticks by itself: the ones the logger put first
        browser.save_screenshot(str(IMAGES / "tensorboard_hparams.png"))


def metrics(root: Path) -> None:
    """`examples/imbalanced_digits.py`: its macro F1 and AUROC per epoch, and its confusion matrix."""
    import imbalanced_digits

    imbalanced_digits.main(["--root-dir", str(root), "--no-progress-bar"])
    with _tensorboard_browser(root, 1500, 680) as (browser, url):
        _time_series(browser, url, "^val/(f1|auroc|acc)$", "metrics_f1.png")
    with _tensorboard_browser(root, 800, 760) as (browser, url):
        _time_series(browser, url, "confusion", "metrics_confusion.png")


class _ConstantRate(digits.DigitsClassifier):
    """The digits module at a constant rate: lr_find rescales updates by `lr / lr_schedule(count)`,
    which a warmup from 0 leaves undefined at its first step."""

    def __init__(self) -> None:
        super().__init__()
        self.lr_schedule = self.hparams.lr

    def configure_optimizer(self):
        return optax.adamw(self.lr_schedule, weight_decay=1e-4)


def lr_find(root: Path) -> None:
    """The loss against the swept learning rate, the suggestion marked."""
    train, _ = digits.digits_splits()
    module = _ConstantRate()
    trainer = fj.Trainer(max_epochs=1, default_root_dir=str(root), enable_progress_bar=False,
                         enable_model_summary=False)
    finder = fj.Tuner(trainer).lr_find(module, fj.DataLoader(train, batch_size=64, shuffle=True, drop_last=True),
                                       min_lr=1e-5, max_lr=1.0, num_training=100)
    figure = finder.plot(suggest=True, path=IMAGES / "lr_find.png")
    figure.set_size_inches(5, 3.2)
    figure.tight_layout()
    figure.savefig(IMAGES / "lr_find.png", dpi=100)
    print(f"lr_find: suggestion {finder.suggestion():.2e}")


MAKERS = {"progress": progress, "tensorboard": tensorboard, "lr_find": lr_find, "metrics": metrics}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", choices=sorted(MAKERS), help="make only these (repeatable)")
    args = parser.parse_args(argv)
    IMAGES.mkdir(parents=True, exist_ok=True)
    for name in args.only or list(MAKERS):
        with tempfile.TemporaryDirectory() as root:
            started = time.perf_counter()
            MAKERS[name](Path(root))
            print(f"{name}: {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
