"""The documentation site holds together as the four parts it is built of: every page is reached
from the home page by following links, the API reference renders the objects adopters use, the
glossary defines the words the explanations use, and the changelog has its Unreleased section.
(`mkdocs build --strict` checks that links and anchors resolve; this checks what they reach.)"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s#]*)(?:#[^)\s]*)?\)")


def linked_pages(page: Path) -> set[Path]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.MULTILINE | re.DOTALL)
    return {(page.parent / t).resolve() for t in LINK.findall(text)
            if t.endswith(".md") and not re.match(r"^[a-z][a-z0-9+.-]*:", t)}


def test_every_page_is_reached_from_the_home_page_by_links():
    # Given the home page, and every page its links lead to, and theirs, ...
    seen, todo = set(), [(DOCS / "index.md").resolve()]
    while todo:
        page = todo.pop()
        if page in seen or not page.is_file():
            continue
        seen.add(page)
        todo += linked_pages(page) - seen
    # Then every page of the site is among them
    assert sorted(p.name for p in DOCS.glob("*.md") if p.resolve() not in seen) == []


def test_the_home_page_leads_to_the_four_parts():
    home = (DOCS / "index.md").read_text()
    for part in ("tutorial.md", "how-to.md", "reference.md", "explanation.md"):
        assert f"]({part})" in home, part


def test_the_api_reference_renders_what_adopters_use():
    page = (DOCS / "api.md").read_text()
    rendered = set(re.findall(r"^::: (\S+)$", page, flags=re.MULTILINE))
    assert {"notifyq.Producer", "notifyq.AsyncProducer", "notifyq.Job", "notifyq.ConsumerService",
            "notifyq.ConsumeOptions", "notifyq.load_config"} <= rendered
    from notifyq import errors  # every error class the package raises on purpose, and Snooze
    raised = {f"notifyq.errors.{n}" for n, v in vars(errors).items()
              if isinstance(v, type) and issubclass(v, BaseException) and v.__module__ == errors.__name__}
    assert sorted(raised - rendered) == []
    assert "notifyq.tasks.TaskRegistry.task" in rendered  # notifyq.task is the default registry's


def test_the_glossary_defines_the_words_the_explanations_use():
    glossary = (DOCS / "glossary.md").read_text()
    defined = {t.lower() for t in re.findall(r"^\*\*(.+?)\.\*\*", glossary, flags=re.MULTILINE)}
    terms = {w for d in defined for w in re.split(r",\s*", d)}
    assert {"bell", "watcher", "ring", "claim token", "lease", "signal row", "suspect", "reaper"} <= terms


def test_the_changelog_keeps_an_unreleased_section_first():
    text = (REPO / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## (.+)$", text, flags=re.MULTILINE)
    assert versions and versions[0] == "[Unreleased]"
    assert (DOCS / "changelog.md").read_text().strip() == '--8<-- "CHANGELOG.md"'  # one copy, shown on the site
