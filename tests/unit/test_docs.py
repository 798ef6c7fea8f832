"""The README and the documentation site hold together: every relative link in README.md lands on
a file of the repository (and a heading, where it names one); the configuration reference names
every config key, NOTIFYQ_* variable and command-line flag the code has; its exit-code table is
the one `notifyq.errors` and `notifyq --help` use. (`mkdocs build --strict`, run by
scripts/test.sh, checks the links inside docs/.)"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import re
import subprocess
import sys
import typing
from pathlib import Path

from markdown.extensions.toc import slugify

from notifyq import config, errors
from notifyq.run import cli, cli_options

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "docs" / "configuration.md"

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def without_code(text: str) -> str:
    """Markdown text without fenced blocks and inline code, where brackets are not links."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(markdown: str) -> set[str]:
    """The ids mkdocs gives the headings of a page (python-markdown's toc slugify)."""
    headings = re.findall(r"^#{1,6} (.+?)\s*$", without_code_blocks(markdown), flags=re.MULTILINE)
    return {slugify(re.sub(r"[`*]", "", h), "-") for h in headings}


def without_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)


def relative_links(path: Path) -> list[str]:
    return [t for t in LINK.findall(without_code(path.read_text()))
            if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]  # http:, https:, mailto: are not files


def test_every_relative_link_in_the_readme_lands_on_a_file_and_heading_of_the_repo():
    # Given the README's links that point into the repository
    links = relative_links(REPO / "README.md")
    assert len(links) > 20, links  # the front door links to the docs; a parser that finds none is broken
    broken = []
    for link in links:
        target, _, anchor = link.partition("#")
        # When each is resolved against the README's folder
        path = (REPO / target).resolve() if target else REPO / "README.md"
        # Then it names a file inside the repository ...
        if not path.is_file() or REPO not in path.parents:
            broken.append(f"{link}: no such file")
        # ... and, for a docs page, a heading that page has (GitHub's ids for the README itself)
        elif anchor and path.suffix == ".md" and anchor not in anchors(path.read_text()):
            broken.append(f"{link}: no heading #{anchor} in {path.relative_to(REPO)}")
    assert broken == []


def test_every_docs_page_is_in_the_site_nav():
    # mkdocs --strict says so too; this says it without building the site. Pages that
    # not_in_nav names (sections written apart, to be folded into a page) are built, not listed.
    nav = (REPO / "mkdocs.yml").read_text()
    block = re.search(r"^not_in_nav: \|\n((?:  .*\n)+)", nav, flags=re.MULTILINE)
    apart = [line.strip().lstrip("/") for line in block.group(1).splitlines()] if block else []
    pages = sorted(p.name for p in (REPO / "docs").glob("*.md"))
    assert pages and [p for p in pages if f": {p}" not in nav and not any(fnmatch.fnmatch(p, a) for a in apart)] == []


# ------------------------------------------------------------------ the configuration reference


def config_keys() -> set[str]:
    """Every key a config file may set, as `section.key` (top-level keys bare)."""
    hints = typing.get_type_hints(config.Config)
    keys = set()
    for f in dataclasses.fields(config.Config):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind) and kind is not config.DSN:  # a section, not the DSN
            keys |= {f"{f.name}.{g.name}" for g in dataclasses.fields(kind)}
    keys = {k.replace("defaults.", "queue.") for k in keys}  # [defaults] and [queue.NAME]: one table
    keys |= {"dsn", "password_file", "connect_retry_s", "shards"}
    keys |= {f"tls.{k}" for k in config.TLS_KEYS}
    return keys


def reference_sections() -> dict[str, str]:
    """The reference's key tables by their `### ` heading."""
    text = REFERENCE.read_text()
    return dict(re.findall(r"^### (.+?)\n(.*?)(?=^#{2,3} )", text, flags=re.MULTILINE | re.DOTALL))


def test_the_reference_names_every_config_key_with_its_default():
    # Given every key the Config dataclasses have, and the reference's table for each section
    tables = reference_sections()
    by_section = {"": "Top level and `[tls]`", "tls": "Top level and `[tls]`", "log": "`[log]`",
                  "wakeup": "`[wakeup]`", "consumer": "`[consumer]`", "producer": "`[producer]`",
                  "queue": "`[defaults]` and `[queue.NAME]`"}
    missing = []
    for key in sorted(config_keys()):
        section, _, name = key.rpartition(".")
        shown = {"shards": "[shards]"}.get(key, key if section in ("", "tls") else name)
        # Then the key is in its section's table
        if f"| `{shown}`" not in tables.get(by_section[section], "") and \
                f", `{shown}`" not in tables.get(by_section[section], ""):
            missing.append(key)
    assert missing == []
    # And the defaults it states are the code's
    queue, tables_text = config.QueueConfig(), tables["`[defaults]` and `[queue.NAME]`"]
    for name in ("batch_size", "workers", "max_attempts", "lease_s", "retry_base_s", "retry_max_s",
                 "command_timeout_s"):
        assert re.search(rf"^\| `{name}` \| `{getattr(queue, name)!r}` \|", tables_text, flags=re.MULTILINE), name


def test_the_reference_names_every_environment_variable():
    text = REFERENCE.read_text()
    section = text.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    assert [v for v in ["NOTIFYQ_CONFIG", "NOTIFYQ_PASSWORD", *config.ENV_KEYS] if f"`{v}`" not in section] == []


def help_of(*command: str) -> str:
    out = subprocess.run([sys.executable, "-m", "notifyq", *command, "--help"], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    return out.stdout


def commands(help_text: str) -> list[str]:
    listing = help_text.split("commands:\n", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"^  (\w+)  ", listing, flags=re.MULTILINE)


def test_the_reference_names_every_command_and_flag():
    # Given every command `notifyq --help` lists, a group's (`jobs`) by its subcommands
    commands_found = []
    for (command,) in [(c,) for c in commands(help_of())]:
        text = help_of(command)
        if "commands:" in text:
            commands_found += [((command, sub), help_of(command, sub)) for sub in commands(text)]
        else:
            commands_found.append(((command,), text))
    names = [" ".join(name) for name, _ in commands_found]
    assert "consume" in names and "jobs purge" in names
    table = REFERENCE.read_text().split("## Command-line flags", 1)[1].split("\n## ", 1)[0]
    missing = []
    for name, text in commands_found:
        # Then each has its row in the reference ...
        row = re.search(rf"^\| `{' '.join(name)}[` ].*$", table, flags=re.MULTILINE)
        if row is None:
            missing.append(" ".join(name))
            continue
        # ... naming each of its flags
        flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", text)) - {"--help", *GLOBAL_FLAGS}
        missing += [f"{' '.join(name)} {f}" for f in sorted(flags)
                    if f"`{f}" not in row.group(0) and f"/{f}" not in row.group(0)]
    assert missing == []
    # And the global options are in their own table
    assert [f for f in GLOBAL_FLAGS if f"| `{f}" not in table] == []


GLOBAL_FLAGS = ("--dsn", "--config", "--log-level", "--log-format", "--version")


# ------------------------------------------------------------------ exit codes


def reference_exit_codes() -> dict[int, str]:
    section = REFERENCE.read_text().split("## Exit codes", 1)[1]
    return {int(code): meaning for code, meaning in re.findall(r"^\| (\d+) \| (.+) \|$", section, flags=re.MULTILINE)}


def test_the_exit_codes_are_one_table_that_the_code_and_the_help_agree_with():
    # Given the reference's table, the source of the exit codes
    documented = reference_exit_codes()
    # Then notifyq.errors has exactly those codes
    assert sorted(documented) == sorted({v for k, v in vars(errors).items() if k.startswith("EXIT_")})
    # And `notifyq --help` lists exactly those
    assert sorted(documented) == sorted(int(c) for c in re.findall(r"(?:^|\s)(\d{1,3})  ", cli_options.EXIT_CODES))
    # And the README points at the table instead of keeping a copy
    readme = (REPO / "README.md").read_text()
    assert "docs/configuration.md#exit-codes" in readme
    assert "| 130 |" not in readme


# ------------------------------------------------------------------ what the pages refer to

# An issue number ("issue 29", "#29") or a file outside the repository (the house notes the
# engineers keep beside it): a reader of the site has neither.
OUTSIDE = re.compile(r"\bissues? #?\d+|(?<![\w./])#\d+\b|STYLE\.md|MYSQL-NOTES", re.I)


def test_no_page_refers_to_issue_numbers_or_to_files_outside_the_repository():
    pages = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]
    found = [f"{page.name}:{n}: {m.group(0)}" for page in pages
             for n, line in enumerate(page.read_text().splitlines(), 1) for m in OUTSIDE.finditer(line)]
    assert found == []
