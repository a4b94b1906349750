"""The live dashboard (/dashboard) in a real headless Chromium, against a real server (conftest.py).

While streaming requests run, the page must draw held blocks with their owners, a non-empty
running queue and a block table per request whose physical blocks are the held cells; once the
streams end it must come back to an empty pool (no held cell, 0 held, 0% KV usage). It must load
nothing from outside the server. The JSON it polls, /dashboard/state, is checked without a browser.

The browser is the system's Chromium driven by the ``playwright`` package (its own browser
downloads are not used). Without them the browser tests are skipped, with the commands to install
them. ``MINIPAGED_SCREENSHOT=1`` saves the screenshot to chapters/11_serving/dashboard.png.
"""

import json
import os
import shutil
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from minipaged.lab.server_process import ServerProcess

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_MS = 30_000  # the most any wait on the page may take
# A common prefix longer than two blocks (the tiny model's tokenizer is one token a byte): the
# prefix cache shares its blocks, so the page has shared cells (a number on them) to draw.
PREFIX = "You are a helpful assistant. Answer in one short sentence. "
PROMPTS = [PREFIX + q for q in ("What is a block?", "What is paging?", "Why cache a prefix?", "Hi")]
# The tiny model's max_model_len is 512 and the server refuses prompt + max_tokens above it; the
# prompts here are under 100 tokens.
MAX_TOKENS = 400


def chromium_path() -> str:
    """The system Chromium, or a skip that says how to install what is missing."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("the dashboard test needs playwright: pip install -e \".[browser]\" "
                    "(it drives the system chromium: apt-get install -y chromium)")
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("the dashboard test needs a chromium binary: apt-get install -y chromium "
                    "(and pip install -e \".[browser]\")")
    return path


@pytest.fixture(scope="module")
def browser():
    path = chromium_path()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


def open_dashboard(browser, url: str, fragment: str = ""):
    """A new page on url/dashboard, with the list of every URL it requested."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(TIMEOUT_MS)
    requested: list[str] = []
    page.on("request", lambda r: requested.append(r.url))
    page.goto(url + "/dashboard" + fragment)
    # the first successful poll
    page.wait_for_function("Number(document.getElementById('updated').textContent) > 0")
    return page, requested


# One consistent snapshot of what the page shows, read in one go (the page's JS runs between two
# evaluations, never during one, so the grid and the table come from the same poll).
SNAPSHOT_JS = """() => {
  const held = {};
  for (const c of document.querySelectorAll('#grid .cell.held'))
    held[c.dataset.block] = {owner: c.dataset.owner, refs: Number(c.dataset.refs), text: c.textContent};
  const rows = [...document.querySelectorAll('#requests tr[data-request]')].map(
    r => ({request: r.dataset.request, blocks: r.dataset.blocks ? r.dataset.blocks.split(' ').map(Number) : []}));
  const text = id => document.getElementById(id).textContent;
  return {held, rows, running: Number(document.getElementById('queue-running').dataset.count),
          countHeld: text('count-held'), usage: text('kv-usage'), status: text('status'),
          cells: document.querySelectorAll('#grid .cell').length};
}"""

BUSY_JS = """() => {
  const owned = [...document.querySelectorAll('#grid .cell.held')].some(c => c.dataset.owner !== '');
  const running = Number(document.getElementById('queue-running').dataset.count) > 0;
  return owned && running && document.querySelectorAll('#requests tr[data-request]').length > 0;
}"""

IDLE_JS = """() => document.querySelectorAll('#grid .cell.held').length === 0
  && document.getElementById('count-held').textContent === '0'
  && document.getElementById('kv-usage').textContent === '0%'
  && document.getElementById('status').textContent === 'live'"""


def stream_until(client, stop: threading.Event, errors: list, prompt: str) -> None:
    """Streams long completions, one after the other, until stop is set (then ends the current one)."""
    try:
        while not stop.is_set():
            stream = client.completions.create(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS, stream=True,
                                               temperature=0, extra_body={"ignore_eos": True})
            for _ in stream:
                pass
    except Exception as e:  # reported by the test, not lost in the thread
        errors.append(e)


def test_dashboard_shows_the_pool_live_then_empty(browser, server, client, tmp_path):
    page, requested = open_dashboard(browser, server.url)
    snap = page.evaluate(SNAPSHOT_JS)
    assert snap["status"] == "live"
    state = json.load(urllib.request.urlopen(server.url + "/dashboard/state", timeout=10))
    assert snap["cells"] == state["num_blocks"] > 0  # one cell per block

    stop, errors = threading.Event(), []
    threads = [threading.Thread(target=stream_until, args=(client, stop, errors, p), daemon=True) for p in PROMPTS]
    for t in threads:
        t.start()
    try:
        # The requests run while the page polls: wait until it shows them.
        page.wait_for_function(BUSY_JS)
        if os.environ.get("MINIPAGED_SCREENSHOT") == "1":  # for the chapter: a few seconds of history
            time.sleep(6)
            page.wait_for_function(BUSY_JS)
        snap = page.evaluate(SNAPSHOT_JS)
        polls = int(page.text_content("#updated"))
        shot = (REPO / "chapters" / "11_serving" / "dashboard.png" if os.environ.get("MINIPAGED_SCREENSHOT") == "1"
                else tmp_path / "dashboard.png")
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shot), full_page=True)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)

    owners = {cell["owner"] for cell in snap["held"].values()}
    assert "" not in owners and len(owners) >= 1
    assert snap["running"] >= 1
    assert int(snap["countHeld"]) == len(snap["held"])
    # Every physical block in a request's table is a held cell; one held once is that request's.
    for row in snap["rows"]:
        assert row["blocks"], row
        for block in row["blocks"]:
            cell = snap["held"].get(str(block))
            assert cell is not None, (row, block)
            if cell["refs"] == 1:
                assert cell["owner"] == row["request"], (row, block, cell)
    assert {row["request"] for row in snap["rows"]} >= owners  # every owner has its row
    # A block with several holders shows how many; one with a single holder shows nothing.
    for cell in snap["held"].values():
        assert cell["text"] == (str(cell["refs"]) if cell["refs"] > 1 else ""), cell
    assert shot.stat().st_size > 0

    # Every stream has ended: the page comes back to an empty pool, still polling.
    page.wait_for_function(IDLE_JS, timeout=20_000)
    assert int(page.text_content("#updated")) > polls
    assert page.evaluate("document.querySelectorAll('#requests tr[data-request]').length") == 0
    # Nothing came from outside the server: no CDN, no font, no script from elsewhere.
    assert requested and all(u.startswith(server.url + "/") for u in requested), requested
    page.close()


def test_dashboard_sends_the_api_key_from_the_url_fragment(browser):
    with ServerProcess("tiny", "--api-key", "s3cret") as s:
        with pytest.raises(urllib.error.HTTPError) as e:  # the state is not open without the key
            urllib.request.urlopen(s.url + "/dashboard/state", timeout=10)
        assert e.value.code == 401
        page, _ = open_dashboard(browser, s.url, "#key=s3cret")
        assert page.text_content("#status") == "live"
        page.close()
        page = browser.new_page()
        page.goto(s.url + "/dashboard")  # no key: the page says why it cannot draw
        page.wait_for_function("document.getElementById('status').textContent.includes('401')", timeout=TIMEOUT_MS)
        page.close()


def test_dashboard_state_json(server):
    state = json.load(urllib.request.urlopen(server.url + "/dashboard/state", timeout=10))
    assert {"time", "kv_policy", "scheduler", "kv_cache_usage", "usage_history", "queues", "num_blocks",
            "block_size", "owner", "refs", "fill", "cached", "requests", "counts"} <= set(state)
    assert set(state["queues"]) == {"waiting", "running", "swapped"}
    assert set(state["counts"]) == {"held", "shared", "cached_free", "free"}
    n = state["num_blocks"]
    assert n > 0 and state["block_size"] > 0
    assert len(state["owner"]) == len(state["refs"]) == len(state["fill"]) == len(state["cached"]) == n
    assert all(len(p) == 2 and 0 <= p[1] <= 1 for p in state["usage_history"])
    page = urllib.request.urlopen(server.url + "/dashboard", timeout=10).read().decode()
    assert "<script" in page and "http://" not in page and "https://" not in page  # nothing from outside
