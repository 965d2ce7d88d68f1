"""Data Docs that render anywhere (adpipe.lakehouse.quality.offline): a site
built by the gate (``validate_frames``, real Great Expectations) loads no
stylesheet or script from a CDN, and in headless Chromium (Debian's, driven
by Playwright; it never downloads a browser) its pages look and work as GE
intends with every address but ``file:`` refused.

What is expected comes from GE's installed templates (the CDN addresses,
the two integrity hashes) and from the libraries' own documentation
(Bootstrap 4.3's spacing and border colour, Font Awesome 6's family, jQuery's
version), never from the module under test. Needs ``make data-docs-assets``
(the Makefile's test targets run it first)."""

from __future__ import annotations

import base64
import hashlib
import re
import shutil
from pathlib import Path

import pytest
from adpipe.lakehouse import quality as Q
from adpipe.lakehouse.quality import offline
from adpipe.settings import Settings, load_settings
from pyspark.sql import SparkSession

from tests.conftest import chromium
from tests.unit.lakehouse.test_quality import HOUR, frames

TEMPLATES = Path(__import__("great_expectations").__file__).parent / "render" / "view" / "templates"
_TAG = re.compile(r"<(script|link)\b[^>]*>", re.IGNORECASE)
_ADDRESS = re.compile(r"""\b(?:src|href)=["']([^"']+)["']""")


def _template_assets() -> dict[str, str | None]:
    """Every stylesheet and script address GE's page templates name, with
    its integrity hash when the template gives one."""
    found: dict[str, str | None] = {}
    for name in ("page.j2", "index_page.j2", "page_minimal.j2", "js_script_imports.j2"):
        for tag in _TAG.finditer((TEMPLATES / name).read_text()):
            address = _ADDRESS.search(tag.group(0))
            if address and address.group(1).startswith("http"):
                integrity = re.search(r'integrity="([^"]+)"', tag.group(0))
                found[address.group(1)] = integrity.group(1) if integrity else None
    return found


def _tags(page: Path) -> list[tuple[str, str]]:
    """(tag, address) of every script and stylesheet of a page (not GE's
    favicon link, whose path in a validation page is one folder short)."""
    return [
        (t.group(0), a.group(1))
        for t in _TAG.finditer(page.read_text())
        if (a := _ADDRESS.search(t.group(0))) and (t.group(1) == "script" or "stylesheet" in t.group(0))
    ]


@pytest.fixture(scope="module")
def site(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("docs-home")
    # The fixture hour has one late event of five (test_quality sets the same limit).
    settings = load_settings({"ADPIPE_HOME": str(home), "ADPIPE_JOB_ID": "unit", "ADPIPE_MAX_LATE_SHARE": "0.25"})
    assert (settings.data_docs_assets / "bootstrap").is_dir(), "run make data-docs-assets first"
    result = Q.validate_frames(settings, HOUR, frames(spark))
    assert result.success and result.data_docs is not None
    return result.data_docs.parent


def _pages(site: Path) -> list[Path]:
    pages = sorted(site.rglob("*.html"))
    assert len(pages) >= 7  # the index, three suites, three validations
    return pages


def test_the_templates_name_the_cdn_files_the_site_no_longer_loads(site: Path) -> None:
    cdn = _template_assets()
    assert len(cdn) == 16  # GE 1.24.1: 7 stylesheets, 9 scripts
    for page in _pages(site):
        for tag, address in _tags(page):
            assert not address.startswith(("http:", "https:", "//")), f"{page.name}: {tag}"
            assert "integrity=" not in tag and "crossorigin" not in tag, f"{page.name}: {tag}"
            assert (page.parent / address).resolve().is_file(), f"{page.name}: {address} is not in the site"
        text = page.read_text()
        assert not [a for a in cdn if a in text], page
        assert "great-expectations-web-assets.s3.us-east-2.amazonaws.com/logo-long.png" not in text


def test_the_site_copies_are_the_files_geS_integrity_hashes_name(site: Path) -> None:
    index = site / "index.html"
    local = {Path(address).name: (index.parent / address).resolve() for _tag, address in _tags(index)}
    pinned = {Path(a).name: h for a, h in _template_assets().items() if h}
    assert sorted(pinned) == ["bootstrap.min.js", "popper.min.js"]
    for name, integrity in pinned.items():
        digest = base64.b64encode(hashlib.sha384(local[name].read_bytes()).digest()).decode()
        assert f"sha384-{digest}" == integrity, name


def test_an_older_site_is_rewritten_whole_when_its_copy_is_made(site: Path, tmp_path: Path) -> None:
    older = tmp_path / "site"
    shutil.copytree(site, older)
    shutil.rmtree(older / "static" / "vendor")
    pages = _pages(older)
    by_name = {Path(a).name: a for a in _template_assets() if not a.endswith(("@5", "@6"))}
    as_ge_wrote = {}
    for page in pages:  # each page back on the CDNs, as GE wrote it before adpipe had the assets
        text = page.read_text()
        for _tag, local in _tags(page):
            if Path(local).name in by_name:
                text = text.replace(f'"{local}"', f'"{by_name[Path(local).name]}"')
        page.write_text(text)
        as_ge_wrote[page] = text
    assert offline.localize(older, tmp_path / "no-assets", pages) == 0  # no copies: the CDN addresses stay
    assert {p: p.read_text() for p in pages} == as_ge_wrote
    # The copy made now: every page of the site is rewritten, not only those named.
    assert offline.localize(older, Settings(home=tmp_path).data_docs_assets, pages[:1]) == len(pages)
    for page in pages:
        assert page.read_text() == (site / page.relative_to(older)).read_text(), page


@pytest.mark.ui
def test_in_chromium_without_the_network_a_page_looks_and_works_as_ge_intends(site: Path) -> None:
    """The sandbox has no internet; the test also refuses every request that
    is not a file, and lists them: none may be a stylesheet or a script."""
    from playwright.sync_api import sync_playwright

    refused: list[str] = []
    page_path = next(site.glob("validations/adpipe_ad_minute_aggregates/*/*/*.html"))
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium())
        try:
            context = browser.new_context(color_scheme="light")
            context.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:")
                          else (refused.append(route.request.url), route.abort()))
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            styled = _look(page, page_path)
            index = _look(page, site / "index.html")
            page_errors = list(errors)
            # The same page with the site's copies refused: unstyled, so the
            # checks above can fail.
            context.route("**/static/vendor/**", lambda route: route.abort())
            bare = _look(page, page_path)
        finally:
            browser.close()

    assert not [u for u in refused if u.split("?")[0].endswith((".css", ".js"))], refused
    assert page_errors == []
    for look in (styled, index):
        # Bootstrap 4.3.1: pl-5 is 3rem, pt-4 1.5rem; border-bottom #dee2e6; its native font stack.
        assert look["padding"] == ["48px", "24px"], look
        assert look["border"] == "rgb(222, 226, 230)", look
        assert look["font"].startswith("-apple-system, BlinkMacSystemFont"), look
        # The scripts ran: jQuery 3.7.1, Bootstrap's and bootstrap-table's plugins, Popper, vega.
        assert look["scripts"] == {"jquery": "3.7.1", "modal": True, "table": True, "popper": True,
                                   "datepicker": True, "vega": True, "embed": True}, look
    assert index["tables"] >= 1  # bootstrap-table built the index's table
    assert styled["icon_font"] == '"Font Awesome 6 Free"' and styled["icon_loaded"], styled
    assert bare["padding"] == ["0px", "0px"] and bare["scripts"]["jquery"] is None, bare
    assert bare["icon_font"] != '"Font Awesome 6 Free"' and not bare["icon_loaded"], bare


def _look(page, path: Path) -> dict:  # noqa: ANN001 - Playwright's Page
    page.goto(path.as_uri(), wait_until="load")
    page.evaluate("document.fonts.ready")
    return page.evaluate("""() => {
        const box = getComputedStyle(document.querySelector('.container-fluid'));
        const nav = getComputedStyle(document.querySelector('nav.navbar'));
        const icon = document.querySelector('i.fas, i.fa');
        const $ = window.jQuery;
        return {
            padding: [box.paddingLeft, box.paddingTop],
            border: nav.borderBottomColor,
            font: getComputedStyle(document.body).fontFamily,
            icon_font: icon ? getComputedStyle(icon).fontFamily : null,
            icon_loaded: [...document.fonts].some(
                f => f.family.includes('Font Awesome 6 Free') && f.status === 'loaded'),
            tables: document.querySelectorAll('.bootstrap-table').length,
            scripts: {
                jquery: $ ? $.fn.jquery : null,
                modal: !!($ && $.fn.modal),
                table: !!($ && $.fn.bootstrapTable),
                popper: typeof window.Popper === 'function',
                datepicker: !!($ && $.fn.datepicker),
                vega: typeof window.vega === 'object',
                embed: typeof window.vegaEmbed === 'function',
            },
        };
    }""")
