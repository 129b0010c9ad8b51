"""Opens gpushim's pages from files in headless Chromium, the network off, and checks what a
user sees (run by tests/page.rs).

usage: check_page.py KINDS_PAGE RING_PAGE SCREENSHOT [RANKS_PAGE]
       check_page.py --real SHOT_DIR PAGE...
       check_page.py --forged PAGE...

KINDS_PAGE is the page of tests/clients/kinds/train.py (known kinds, one growing line);
RING_PAGE the page of a ring trace of 10^8 records; RANKS_PAGE, a page of two traces, whose
picker must show each. With --real, the pages of real runs
(scripts/gpu.sh page): each opens with no console error and no request, draws parameters and
activations, draws every line its growing table names as a band of its own, names a band on
hover; a screenshot of each goes to SHOT_DIR. With --forged, pages whose data claims what no
run gives (columns before the ring past the last column, sizes past any number): each draws its
bands by kind and by line, with no console error. Exits non-zero naming the first check that fails;
prints "browser check passed" at the end."""
import os
import sys
import time

from playwright.sync_api import sync_playwright

KINDS = ["parameters", "gradients", "optimizer state", "activations", "cuBLAS workspaces"]


def fail(msg):
    print("FAILED: " + msg)
    sys.exit(1)


def open_page(browser, path, problems):
    ctx = browser.new_context(offline=True, viewport={"width": 1280, "height": 1000})
    # Anything but the file itself is a request to the network: refused, and a failure.
    ctx.route(
        "**/*",
        lambda route: route.continue_()
        if route.request.url.startswith("file://")
        else (problems.append("request: " + route.request.url), route.abort()),
    )
    page = ctx.new_page()
    page.on(
        "console",
        lambda m: problems.append("console %s: %s" % (m.type, m.text))
        if m.type in ("error", "warning")
        else None,
    )
    page.on("pageerror", lambda e: problems.append("page error: %s" % e))
    started = time.monotonic()
    page.goto("file://" + os.path.abspath(path), wait_until="load")
    page.wait_for_selector("path.band")
    return page, time.monotonic() - started


def hover_shows(page, band, expect):
    at = page.evaluate("(b) => gpushimPage.locate(b)", band)
    if at is None:
        fail("no band named %r to hover: %s" % (band, page.evaluate("gpushimPage.bands()")))
    page.mouse.move(at["x"], at["y"])
    tip = page.inner_text("#tip")
    if expect not in tip:
        fail("hovering %r shows %r, not %r" % (band, tip, expect))
    return tip


def launch(p):
    return p.chromium.launch(
        executable_path=os.environ.get("GPUSHIM_CHROMIUM", "/usr/bin/chromium"),
        args=[
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ],
    )


def real(shots, pages):
    with sync_playwright() as p:
        browser = launch(p)
        for path in pages:
            problems = []
            page, took = open_page(browser, path, problems)
            drawn = page.evaluate("gpushimPage.bands()")
            # A ring's detail may hold only the run's last moments: what came before is the
            # checkpoint's series, said above the chart, and the kinds are those of the detail.
            ring = "longer than its ring" in page.inner_text("#notes")
            for k in ("parameters",) if ring else ("parameters", "activations"):
                if k not in drawn:
                    fail("%s: %r is not drawn: %s" % (path, k, drawn))
            hover_shows(page, "parameters" if ring else "activations", "")
            growing = page.locator("#growing td.site").all_inner_texts()
            page.click("#view button[data-value=line]")
            lines = page.evaluate("gpushimPage.bands()")
            for g in growing:
                label = g.split("  (kept with:")[0]
                if label not in lines:
                    fail("%s: the growing line %r is not a band: %s" % (path, label, lines))
            page.click("#view button[data-value=kind]")
            page.mouse.move(1, 1)
            name = os.path.splitext(os.path.basename(path))[0]
            page.screenshot(path=os.path.join(shots, name + ".png"), full_page=True)
            if problems:
                fail("%s: %s" % (path, "; ".join(problems)))
            print("%s: opened in %.2f s, %d bands, %d growing lines drawn" % (name, took, len(drawn), len(growing)))
        browser.close()
    print("browser check passed")


def forged(pages):
    with sync_playwright() as p:
        browser = launch(p)
        for path in pages:
            problems = []
            started = time.monotonic()
            page, _ = open_page(browser, path, problems)
            kinds = page.evaluate("gpushimPage.bands()")
            page.click("#view button[data-value=line]")
            lines = page.evaluate("gpushimPage.bands()")
            took = time.monotonic() - started
            if not kinds or not lines:
                fail("%s: no bands drawn (%r, %r)" % (path, kinds, lines))
            if problems:
                fail("%s: %s" % (path, "; ".join(problems)))
            print("%s: %d bands by kind, %d by line, in %.2f s" % (path, len(kinds), len(lines), took))
        browser.close()
    print("browser check passed")


def activation_line():
    """The line of the stand-in's Linear.forward that keeps the activation (tests/clients)."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "clients", "kinds", "torch", "nn", "modules", "linear.py")
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if "an activation" in line:
                return n
    fail("no activation in %s" % path)


def main():
    if sys.argv[1] == "--real":
        return real(sys.argv[2], sys.argv[3:])
    if sys.argv[1] == "--forged":
        return forged(sys.argv[2:])
    kinds_page, ring_page, shot = sys.argv[1:4]
    with sync_playwright() as p:
        browser = launch(p)
        problems = []
        page, _ = open_page(browser, kinds_page, problems)
        drawn = page.evaluate("gpushimPage.bands()")
        for k in KINDS:
            if k not in drawn:
                fail("the kind %r is not drawn: %s" % (k, drawn))
        n = page.locator("path.band").count()
        if n < len(KINDS):
            fail("%d bands drawn" % n)
        # Hovering the activations names their lines, the growing one first.
        growing = page.inner_text("#growing td.site")
        tip = hover_shows(page, "activations", "activations")
        if "linear.py:%d" % activation_line() not in tip:
            fail("the activations' tip names no line: %r" % tip)
        # Clicking shows the whole stack.
        page.mouse.down()
        page.mouse.up()
        stack = page.inner_text("#detail")
        if "Linear.forward" not in stack or "train.py" not in stack:
            fail("clicking the activations shows no stack: %r" % stack)
        # By line: the growing line is a band of its own, and hovering it names it.
        page.click("#view button[data-value=line]")
        lines = page.evaluate("gpushimPage.bands()")
        if growing not in lines:
            fail("the growing line %r is not drawn by line: %s" % (growing, lines))
        hover_shows(page, growing, growing[:40])
        # The time axis draws too; the peak is marked.
        page.click("#axis button[data-value=time]")
        if page.locator("[data-mark=peak]").count() != 1:
            fail("no peak mark")
        page.click("#view button[data-value=kind]")
        page.click("#axis button[data-value=changes]")
        page.mouse.move(1, 1)
        page.screenshot(path=shot, full_page=True)
        # The ring of 10^8 records: opens in under 2 s.
        ring, took = open_page(browser, ring_page, problems)
        if took >= 2.0:
            fail("the ring's page took %.2f s to open" % took)
        if "longer than its ring" not in ring.inner_text("#notes"):
            fail("the ring's page does not say what came from the checkpoint")
        if len(sys.argv) > 5:
            # A run with a failed allocation: its mark has a legend entry, and the lines in the
            # table of failures wrap between words, never inside a name.
            oom, _ = open_page(browser, sys.argv[5], problems)
            if oom.locator("[data-mark=failure]").count() < 1:
                fail("the failed allocation is not marked")
            entry = oom.locator("[data-legend=failure]").all_inner_texts()
            if not entry or "failed allocation" not in entry[0]:
                fail("the failure mark has no legend entry: %r" % entry)
            wraps = oom.evaluate(
                "getComputedStyle(document.querySelector('#ooms td.site')).overflowWrap")
            if wraps == "anywhere":
                fail("the failures' lines break anywhere, inside names")
        if len(sys.argv) > 4:
            ranks, _ = open_page(browser, sys.argv[4], problems)
            options = ranks.locator("#rank option").all_inner_texts()
            if len(options) != 2:
                fail("the picker offers %s" % options)
            first = ranks.inner_text("#sub")
            ranks.select_option("#rank", "1")
            second = ranks.inner_text("#sub")
            if first == second or not ranks.evaluate("gpushimPage.bands()"):
                fail("picking the second trace changed nothing: %r" % second)
        if problems:
            fail("; ".join(problems))
        browser.close()
    print("kinds page: %d bands; ring page opened in %.2f s" % (n, took))
    print("browser check passed")


if __name__ == "__main__":
    main()
