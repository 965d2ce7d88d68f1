"""The reference docs hold to the code: every ``ADPIPE_*`` setting the
package reads is in docs/configuration.md with the code's default, and
every ``adpipe`` verb and option is in docs/cli.md. The names and defaults
are read from the code (``ast``) and the verbs from the real parser, so a
setting or a verb added without its docs fails here."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

import pytest
from adpipe.settings import PROJECT_ROOT, AirflowRails, Settings, Topics, load_settings

from tests.unit.helpers import DOCS, doc_sections, first_code, table_rows

PACKAGE = PROJECT_ROOT / "include" / "adpipe"
SETTINGS_PY = PACKAGE / "settings.py"
NAME = r"ADPIPE_[A-Z0-9_]*[A-Z0-9]"

# --- the settings -------------------------------------------------------------

# A reader's default: env.get(name, d), os.environ.get(name, d) and the
# readers of adpipe.setting_values (``integer(env, name, d, ...)``); ``choice``
# and ``_one_of`` default to their first choice.
_FIRST_CHOICE = {"choice", "_one_of"}
_DEFAULT_THIRD = {"integer", "utc_time", "share", "money", "budget", "jvm_memory", "port", "above"}
_CLASSES = {"Settings": Settings, "AirflowRails": AirflowRails, "Topics": Topics}
NOT_LITERAL = object()


def _literal(node: ast.expr | None, constants: dict[str, object]) -> object:
    """A default's value when it is a literal (or a class attribute's, or a
    module constant's), else NOT_LITERAL."""
    if node is None:
        return None
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in constants:
        return constants[node.id]
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in _CLASSES:
        return getattr(_CLASSES[node.value.id], node.attr)
    return NOT_LITERAL


def _function(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def read_settings(path: Path) -> dict[str, object]:
    """Every ``ADPIPE_*`` name a module holds as a whole string (read,
    or written for another process to read), with its default where the
    module reads it with a literal one (else NOT_LITERAL)."""
    tree = ast.parse(path.read_text())
    constants = {
        t.id: n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found: dict[str, object] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg and re.fullmatch(NAME, node.arg):
            found.setdefault(node.arg, NOT_LITERAL)
        if not isinstance(node, ast.Call) or not node.args:
            continue
        names = [(i, _literal(a, constants)) for i, a in enumerate(node.args)]
        names = [(i, n) for i, n in names if isinstance(n, str) and re.fullmatch(NAME, n)]
        for i, name in names:
            function, rest = _function(node), node.args[i + 1:]
            if function == "get" and i == 0:
                default = _literal(rest[0], constants) if rest else None
                parent = parents.get(node)
                if not rest and isinstance(parent, ast.BoolOp) and isinstance(parent.op, ast.Or):
                    default = _literal(parent.values[-1], constants)
            elif function in _FIRST_CHOICE and rest and isinstance(rest[0], ast.Tuple):
                default = _literal(rest[0].elts[0], constants)
            elif function in _DEFAULT_THIRD and rest:
                default = _literal(rest[0], constants)
            else:
                default = NOT_LITERAL
            if found.get(name, NOT_LITERAL) is NOT_LITERAL:
                found[name] = default
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(NAME, node.value):
            found.setdefault(node.value, NOT_LITERAL)
    return found


def code_settings() -> dict[str, dict[str, object]]:
    """Per module of the package: its ``ADPIPE_*`` names and literal defaults."""
    return {str(p.relative_to(PACKAGE)): read_settings(p) for p in sorted(PACKAGE.rglob("*.py"))}


def default_value(cell: str) -> str | None:
    """A default cell's value: the `code` it starts with (None: the cell
    describes a default that is computed, or says it is empty or unset)."""
    return first_code(cell) if cell.startswith("`") else None


def documented_settings() -> dict[str, str]:
    """docs/configuration.md's settings: name -> its default cell."""
    rows = table_rows((DOCS / "configuration.md").read_text())
    settings = {}
    for row in rows:
        name = first_code(row[0])
        if name and name.startswith("ADPIPE_"):
            assert name not in settings, f"{name} is in docs/configuration.md twice"
            assert len(row) == 3, f"{name}: a row is name | default | meaning, got {row}"
            settings[name] = row[1]
    return settings


def test_every_setting_the_code_reads_is_documented_and_no_other() -> None:
    in_code = {name for names in code_settings().values() for name in names}
    documented = set(documented_settings())
    assert len(in_code) > 90  # the reader found them (92 in settings.py alone)
    assert sorted(in_code - documented) == [], "settings read by the code, missing from docs/configuration.md"
    assert sorted(documented - in_code) == [], "docs/configuration.md names settings nothing reads"


def test_each_documented_default_is_the_codes() -> None:
    """A setting settings.py reads has its default; one read elsewhere, the
    default of the module that reads it (a tool that gives its children
    another value, as chaos and the demo do, sets a value, not a default)."""
    documented = documented_settings()
    by_settings = code_settings()["settings.py"]
    checked = 0
    for module, names in code_settings().items():
        for name, default in names.items():
            if default is NOT_LITERAL or (name in by_settings and module != "settings.py"):
                continue
            cell = documented[name]
            if default in ("", None):
                assert cell.startswith(("empty", "unset")), f"{name} ({module}): no default, the docs say {cell!r}"
            else:
                assert default_value(cell) == str(default), f"{name} ({module}): default {default!r}, docs {cell!r}"
            checked += 1
    assert checked > 70


def test_the_documented_defaults_change_nothing(tmp_path: Path) -> None:
    """Each literal default of settings.py's table, given as a value, loads
    the settings the unset variable does."""
    read_by_settings = read_settings(SETTINGS_PY)
    base = {"ADPIPE_HOME": str(tmp_path)}
    unset = load_settings(base)
    for name, cell in documented_settings().items():
        value = default_value(cell)
        if name in read_by_settings and value is not None:
            assert load_settings({**base, name: value}) == unset, f"{name}={value} is not its default"


def test_the_settings_reader_finds_a_new_setting_and_its_default(tmp_path: Path) -> None:
    module = tmp_path / "new.py"
    module.write_text(
        "import os\nKEY = 'ADPIPE_KEYED'\n"
        "a = integer(env, 'ADPIPE_NEW_S', 7, 1)\n"
        "b = env.get('ADPIPE_OR') or 'x'\n"
        "c = choice(env, 'ADPIPE_CHOICE', ('on', 'off'))\n"
        "d = os.environ.get(KEY, '')\n"
        "e = env.get('ADPIPE_LATE', Settings.watermark_delay_s)\n"
        "f = env.get('ADPIPE_HOME') or here / 'x'\n"
        "g = dict(ADPIPE_WRITTEN='1')\n"
    )
    assert read_settings(module) == {
        "ADPIPE_NEW_S": 7, "ADPIPE_OR": "x", "ADPIPE_CHOICE": "on", "ADPIPE_KEYED": "",
        "ADPIPE_LATE": 30, "ADPIPE_HOME": NOT_LITERAL, "ADPIPE_WRITTEN": NOT_LITERAL,
    }


def test_operations_points_to_the_configuration_reference() -> None:
    section = doc_sections(DOCS / "operations.md")["Configuration"]
    assert "configuration.md" in section
    assert section.count("ADPIPE_") < 5, "operations.md lists settings again: they belong in configuration.md"


# --- the command line ---------------------------------------------------------


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every parser of the real ``adpipe`` command, by its command line
    (``adpipe``, ``adpipe kafka``, ``adpipe budget report``, ...)."""
    from adpipe.cli import build_parser

    found: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        found[path] = parser
        for action in parser._actions:  # noqa: SLF001 - argparse keeps its actions there
            if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
                for name, child in action.choices.items():
                    walk(child, f"{path} {name}")

    walk(build_parser(), "adpipe")
    return found


def options(parser: argparse.ArgumentParser) -> list[tuple[str, ...]]:
    """A parser's options but --help, each as its option strings."""
    return [tuple(a.option_strings) for a in parser._actions if a.option_strings and a.dest != "help"]  # noqa: SLF001


def choices(parser: argparse.ArgumentParser) -> list[str]:
    """The choices of its positional arguments (``up``, ``down``, ...), its
    sub-commands left out (each has a section of its own)."""
    return [
        str(choice)
        for a in parser._actions  # noqa: SLF001
        if not a.option_strings and a.choices and not isinstance(a, argparse._SubParsersAction)  # noqa: SLF001
        for choice in a.choices
    ]


def documented_options(section: str) -> set[str]:
    """The options a section's table lists: the first word of each `code`
    span of each row's first cell (`--brokers N`, `-v`, `--verbose`)."""
    return {
        span.split()[0]
        for row in table_rows(section)
        for span in re.findall(r"`([^`]*)`", row[0])
        if span.startswith("-")
    }


def test_every_verb_and_option_is_documented_and_no_other() -> None:
    sections = {h: text for h, text in doc_sections(DOCS / "cli.md").items() if h.startswith("adpipe")}
    commands = parsers()
    assert len(commands) > 15  # the reader found them (19 with the budget's actions)
    assert sorted(set(commands) - set(sections)) == [], "verbs without a section in docs/cli.md"
    assert sorted(set(sections) - set(commands)) == [], "docs/cli.md has sections of verbs the parser lacks"
    for command, parser in commands.items():
        listed = documented_options(sections[command])
        for strings in options(parser):
            assert set(strings) & listed, f"{command}: {'/'.join(strings)} is not in docs/cli.md's table"
        known = {s for strings in options(parser) for s in strings}
        assert listed <= known, f"{command}: docs/cli.md lists {sorted(listed - known)}, which it does not take"
        spans = " ".join(re.findall(r"`([^`]*)`", sections[command]))
        for choice in choices(parser):
            assert re.search(rf"(?<![\w-]){re.escape(choice)}(?![\w-])", spans), f"{command} {choice}: not in docs"


def test_the_cli_reader_sees_a_new_option() -> None:
    parser = argparse.ArgumentParser(prog="adpipe")
    parser.add_argument("--fresh", action="store_true")
    sub = parser.add_subparsers(dest="verb")
    sub.add_parser("x").add_argument("mode", choices=["on", "off"])
    assert options(parser) == [("--fresh",)]
    assert choices(parser._subparsers._group_actions[0].choices["x"]) == ["on", "off"]  # noqa: SLF001
    assert documented_options("| option | meaning |\n|---|---|\n| `--fresh N` | new |") == {"--fresh"}


def test_adpipe_version_prints_the_packages_version(capsys: pytest.CaptureFixture[str]) -> None:
    from adpipe import __version__
    from adpipe.cli import build_parser

    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"adpipe {__version__}"


# --- releases and the changelog -------------------------------------------------

CHANGELOG = PROJECT_ROOT / "CHANGELOG.md"
RELEASE = re.compile(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$")


def releases() -> list[tuple[str, str]]:
    """The CHANGELOG's released versions and dates, top to bottom."""
    headings = [line for line in CHANGELOG.read_text().splitlines() if line.startswith("## ")]
    assert headings[0] == "## [Unreleased]", "the CHANGELOG opens with ## [Unreleased]"
    found = [RELEASE.match(h) for h in headings[1:]]
    wrong = [h for h, m in zip(headings[1:], found) if not m]
    assert not wrong, f"a release heading is ## [X.Y.Z] - YYYY-MM-DD: {wrong}"
    return [(m.group(1), m.group(2)) for m in found]


def test_the_version_is_the_changelogs_latest_release() -> None:
    from adpipe import __version__

    assert __version__ == releases()[0][0]


def test_the_releases_go_down_in_version_and_date() -> None:
    listed = releases()
    versions = [tuple(int(n) for n in v.split(".")) for v, _ in listed]
    dates = [d for _, d in listed]
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions)
    assert dates == sorted(dates, reverse=True)


def test_each_release_is_told_under_keep_a_changelogs_headings() -> None:
    allowed = {"### Added", "### Changed", "### Deprecated", "### Removed", "### Fixed", "### Security"}
    headings = [line for line in CHANGELOG.read_text().splitlines() if line.startswith("### ")]
    assert headings and set(headings) <= allowed, sorted(set(headings) - allowed)


def test_pyproject_reads_the_version_from_the_package() -> None:
    text = (PROJECT_ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in text and 'version = { attr = "adpipe.__version__" }' in text
    assert not re.search(r'^version\s*=\s*"', text, flags=re.M), "pyproject.toml writes a version of its own"


# --- no issue numbers -------------------------------------------------------------

ISSUE = re.compile(r"(?<![\w&/#])#\d+\b|\b[Ii]ssues?\s+#?\d+")


def pages() -> list[Path]:
    return [*sorted(DOCS.glob("*.md")), PROJECT_ROOT / "README.md", CHANGELOG, PROJECT_ROOT / "dags" / "README.md"]


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(PROJECT_ROOT)))
def test_no_page_names_an_issue_number(page: Path) -> None:
    found = [m.group(0) for m in ISSUE.finditer(page.read_text())]
    assert found == [], f"{page.name} names issue numbers (say what is true, or link an upstream bug)"


def test_the_issue_rule_catches_the_forms_it_means() -> None:
    caught = "fixed in #31; issue 30 item 7; Issue #12; see issues 4; an Issue\n29"
    found = [m.group(0) for m in ISSUE.finditer(caught)]
    assert found == ["#31", "issue 30", "Issue #12", "issues 4", "Issue\n29"]
    fine = "[bug](https://github.com/o/r/issues/5511), (#three-brokers), &#160;, C# 12, 7 issues"
    assert [m.group(0) for m in ISSUE.finditer(fine)] == []


# --- links between the pages ---------------------------------------------------------


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but ``-`` and
    ``_`` dropped, each space a ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {anchor(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, flags=re.M)}


def test_every_link_between_the_pages_lands() -> None:
    """A relative link reaches a file, and its #anchor one of that page's
    headings."""
    broken = []
    for page in pages():
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, fragment = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert broken == []


def test_anchors_are_githubs() -> None:
    assert anchor("Union & Load and the quality gate") == "union--load-and-the-quality-gate"
    assert anchor("`ads.ad_events_raw`") == "adsad_events_raw"
    assert anchor("The test suites' variables") == "the-test-suites-variables"
