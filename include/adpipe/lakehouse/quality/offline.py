"""Data Docs that render anywhere: the stylesheets, scripts and fonts Great
Expectations' pages load from CDNs, copied into the site and the pages
pointed at those copies, so a site opened from a worker or an air-gapped
network looks as GE intends (GE 1.24's templates name 16 such files; GE
offers no option to serve them itself).

1. ``make data-docs-assets`` installs them with npm, at the versions the
   templates name (``deploy/data-docs/package.json`` and its lock), into
   ``.cache/data-docs/node_modules`` (:attr:`Settings.data_docs_assets`).
2. After each checkpoint run has rendered its pages (under the GE context's
   lock), :func:`localize` copies the files into the site's
   ``static/vendor/`` (once per site: the copy is marked with the list of
   what it holds), then rewrites the pages GE just wrote: every ``<script
   src>`` and ``<link href>`` of :data:`CDN_FILES` becomes a path relative
   to the page, without ``integrity`` and ``crossorigin`` (a page opened as
   a file has no origin a CORS request could succeed from; the files are
   the ones the integrity hashes name: a test checks). GE's logo, served
   from its own bucket, becomes the copy GE puts in the site
   (``static/images/logo-long.png``). A site whose copy is made now has
   every page rewritten, older ones included.

Without the npm files the pages keep their CDN addresses (a warning says
so): they render where the CDNs are reachable. Links to GE's documentation
stay links, and the dark theme's logo (``full_logo_dark.png``, in no
package) stays on GE's bucket."""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

VENDOR = Path("static") / "vendor"
MARKER = ".adpipe-assets"

# What GE 1.24.1's templates load (render/view/templates: page.j2,
# index_page.j2, page_minimal.j2, js_script_imports.j2) -> the file of the
# npm package (deploy/data-docs/package.json) that the address serves.
CDN_FILES: dict[str, str] = {
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.css":
        "bootstrap-table/dist/bootstrap-table.min.css",
    "https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css": "bootstrap/dist/css/bootstrap.min.css",
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.css":
        "bootstrap-table-1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.css",
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.min.css":
        "bootstrap-table-1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.min.css",
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/css/bootstrap-datepicker.min.css":
        "bootstrap-datepicker/dist/css/bootstrap-datepicker.min.css",
    "https://cdn.jsdelivr.net/npm/@forevolve/bootstrap-dark@1.1.0/dist/css/bootstrap-prefers-dark.css":
        "@forevolve/bootstrap-dark/dist/css/bootstrap-prefers-dark.css",
    # A major version only: jsDelivr serves the newest 5.x (6.x) and its
    # package.json's "jsdelivr" file; the lock pins the newest at install.
    "https://cdn.jsdelivr.net/npm/vega@5": "vega/build/vega.min.js",
    "https://cdn.jsdelivr.net/npm/vega-lite@5": "vega-lite/build/vega-lite.min.js",
    "https://cdn.jsdelivr.net/npm/vega-embed@6": "vega-embed/build/vega-embed.min.js",
    "https://cdnjs.cloudflare.com/ajax/libs/font-awesome/6.6.0/css/all.min.css":
        "@fortawesome/fontawesome-free/css/all.min.css",
    "https://code.jquery.com/jquery-3.7.1.min.js": "jquery/dist/jquery.min.js",
    "https://cdnjs.cloudflare.com/ajax/libs/popper.js/1.12.9/umd/popper.min.js": "popper.js/dist/umd/popper.min.js",
    "https://stackpath.bootstrapcdn.com/bootstrap/4.3.1/js/bootstrap.min.js": "bootstrap/dist/js/bootstrap.min.js",
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.js":
        "bootstrap-table/dist/bootstrap-table.min.js",
    "https://unpkg.com/bootstrap-table@1.19.1/dist/extensions/filter-control/bootstrap-table-filter-control.min.js":
        "bootstrap-table/dist/extensions/filter-control/bootstrap-table-filter-control.min.js",
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/js/bootstrap-datepicker.min.js":
        "bootstrap-datepicker/dist/js/bootstrap-datepicker.min.js",
}
# Folders a stylesheet loads from relative to itself (Font Awesome's fonts).
CDN_FOLDERS = ("@fortawesome/fontawesome-free/webfonts",)
# GE's logo, with the query GE adds, -> the copy in the site itself.
_LOGO = re.compile(r"https://great-expectations-web-assets\.s3\.us-east-2\.amazonaws\.com/logo-long\.png(\?[^\"']*)?")
SITE_LOGO = Path("static") / "images" / "logo-long.png"
_TAG = re.compile(r"<(?:script|link)\b[^>]*>", re.IGNORECASE)
_ADDRESS = re.compile(r"""\b(src|href)=(["'])(.*?)\2""", re.IGNORECASE)
_DROPPED = re.compile(r"""\s+(?:integrity|crossorigin)(?:=(["']).*?\1)?""", re.IGNORECASE)


def vendor_copy(site: Path, assets: Path) -> bool:
    """Copy the files into ``site/static/vendor`` unless this list of them
    is there already. True when copied now; False when there already, or
    when ``assets`` lacks one (nothing copied, a warning)."""
    target = site / VENDOR
    listing = "\n".join(sorted({*CDN_FILES.values(), *CDN_FOLDERS})) + "\n"
    if (target / MARKER).exists() and (target / MARKER).read_text() == listing:
        return False
    missing = [f for f in [*CDN_FILES.values(), *CDN_FOLDERS] if not (assets / f).exists()]
    if missing:
        log.warning("Data Docs keep their CDN addresses: %s lacks %s (make data-docs-assets)", assets,
                    ", ".join(missing[:3]))
        return False
    for name in CDN_FILES.values():
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(assets / name, target / name)
    for name in CDN_FOLDERS:
        shutil.copytree(assets / name, target / name, dirs_exist_ok=True)
    (target / MARKER).write_text(listing)
    log.info("Data Docs assets copied into %s", target)
    return True


def _relative(site: Path, page: Path, file: Path) -> str:
    return Path(os.path.relpath(site / file, page.parent)).as_posix()


def rewrite_page(site: Path, page: Path) -> bool:
    """Point one page at the site's copies; True when it changed."""
    text = page.read_text(encoding="utf-8")

    def local_tag(match: re.Match[str]) -> str:
        tag = match.group(0)
        address = _ADDRESS.search(tag)
        if address is None or address.group(3) not in CDN_FILES:
            return tag
        local = _relative(site, page, VENDOR / CDN_FILES[address.group(3)])
        tag = tag[: address.start(3)] + local + tag[address.end(3):]
        return _DROPPED.sub("", tag)

    changed = _LOGO.sub(_relative(site, page, SITE_LOGO), _TAG.sub(local_tag, text))
    if changed == text:
        return False
    page.write_text(changed, encoding="utf-8")
    return True


def localize(site: Path, assets: Path, pages: Iterable[Path] = ()) -> int:
    """Make the site render without the CDNs: the copies (:func:`vendor_copy`),
    then ``pages`` rewritten (every page of the site when the copy was made
    now). Returns the number of pages changed."""
    fresh = vendor_copy(site, assets)
    if not (site / VENDOR / MARKER).exists():
        return 0
    targets = sorted(site.rglob("*.html")) if fresh else sorted(set(pages))
    changed = sum(rewrite_page(site, page) for page in targets if page.exists())
    log.info("Data Docs: %d of %d pages pointed at the site's own assets", changed, len(targets))
    return changed


def run_pages(site: Path, run_name: str) -> list[Path]:
    """The pages a checkpoint run of ``run_name`` (re)writes: the index, the
    suites' pages and its validation pages."""
    validations = site.glob(f"validations/*/{run_name}/**/*.html")
    return [site / "index.html", *site.glob("expectations/**/*.html"), *validations]
