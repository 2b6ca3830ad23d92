"""The docs describe the code: a state or a setting missing from them fails here."""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

from django_pgjobs import conf
from django_pgjobs.status import AttemptOutcome, JobStatus, TerminalReason

ROOT = Path(__file__).resolve().parent.parent


def read(path: str) -> str:
    return (ROOT / path).read_text(encoding="utf-8")


def test_the_state_machine_doc_names_every_state_reason_and_outcome() -> None:
    text = read("docs/state-machine.md")
    states_section = text.split("## The states", 1)[1]
    table_states = re.findall(r"^\| `(\w+)` \|", states_section, re.MULTILINE)
    assert table_states == list(JobStatus.values)
    for value in [*TerminalReason.values, *AttemptOutcome.values]:
        assert f"`{value}`" in text, value


def test_the_settings_reference_documents_every_setting_and_the_readme_links_it() -> None:
    reference = read("docs/settings.md")
    settings = sorted(name[len("DEFAULT_"):] for name in vars(conf) if name.startswith("DEFAULT_"))
    rows = re.findall(r"^\| `PGJOBS_(\w+)` \|", reference, re.MULTILINE)
    assert sorted(rows) == settings
    assert "(docs/settings.md)" in read("README.md")


def readme_sections() -> dict[str, str]:
    """The README's ``## `` sections by title, in order."""
    parts = re.split(r"^## (.+)$", read("README.md"), flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_the_readme_takes_a_user_from_install_to_operating_before_contributing() -> None:
    titles = list(readme_sections())
    assert titles[:8] == [
        "Install", "Configure: the database must be PostgreSQL", "A first job",
        "Write a handler", "Enqueue in your transaction", "Run workers", "Operate it",
        "Periodic schedules",
    ]
    assert titles[-1] == "Contributing"
    for_users = "".join(text for title, text in readme_sections().items()
                        if title not in ("Documentation", "Contributing"))
    for contributor_words in ("make demo", "make test", "DATABASE_URL", "embedded", ".ci/run"):
        assert contributor_words not in for_users, contributor_words
    assert "make test   # the whole test suite" in readme_sections()["Contributing"]
    assert "(docs/contributing.md)" in readme_sections()["Contributing"]


def test_the_readme_installs_from_a_checkout_or_a_wheel_not_from_the_unpublished_name() -> None:
    install = readme_sections()["Install"]
    commands = re.findall(r"^pip install (\S+)", install, re.MULTILINE)
    assert commands == ["./django-pgjobs", "'./django-pgjobs[metrics]'", "'./django-pgjobs[otel]'",
                        "'./django-pgjobs[pydantic]'", "'./django-pgjobs[encryption]'",
                        "dist/django_pgjobs-0.1.0-py3-none-any.whl"]
    assert "not published on PyPI yet" in install
    assert "Once it is published, `pip install django-pgjobs`" in install


def test_the_readme_handler_example_names_nothing_it_does_not_import_or_define() -> None:
    section = readme_sections()["Write a handler"]
    code = section.split("```python\n", 1)[1].split("\n```", 1)[0]
    tree = ast.parse(code)
    bound = {alias.asname or alias.name.split(".")[0]
             for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)
             for alias in node.names}
    bound |= {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    bound |= {arg.arg for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
              for arg in node.args.args}
    bound |= {node.id for node in ast.walk(tree)
              if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}
    used = {node.id for node in ast.walk(tree)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    assert used - bound - set(dir(builtins)) == set()
    # What the imported stand-ins are is said before the code.
    assert "`Order` is a model of the `billing` app" in section
    assert "`payments` stands for the provider's API client" in section


def test_the_readme_says_a_skip_schedule_runs_every_tick_within_the_grace() -> None:
    schedules = readme_sections()["Periodic schedules"]
    assert "`PGJOBS_SCHEDULE_GRACE_SECONDS` (60 s) of its time always runs" in schedules
    assert "after 60 s without a worker a per-second schedule\nenqueues 61 ticks" in schedules
    assert "only the latest runs;" not in schedules


def test_ci_runs_the_readme_test_command_as_written_and_against_the_machine_server() -> None:
    assert "make test   # the whole test suite" in read("README.md")
    legs = [line for line in read(".ci/run").splitlines()
            if re.search(r"\bmake test\b", line) and not line.lstrip().startswith(("#", "leg "))]
    # One leg exactly as a newcomer runs it (no DATABASE_URL: the embedded server), one against
    # the machine's server.
    assert legs[0].split(">")[0].rstrip() == "env -u DATABASE_URL make test"
    assert legs[1].startswith("DATABASE_URL=$MACHINE_DATABASE_URL make test ")
    assert len(legs) == 2


def test_the_claim_path_doc_shows_the_claim_statement_as_it_is_sent() -> None:
    from django_pgjobs.transitions import claim_statement

    text = read("docs/claim-path.md")
    block = text.split("```sql\n", 1)[1].split("\n```", 1)[0]
    assert block == claim_statement(10).text


def test_the_state_machine_doc_lists_the_ways_out_of_running() -> None:
    from django_pgjobs.outcomes import WAYS_OUT

    text = read("docs/state-machine.md")
    rows = dict(re.findall(r"^\| `(\w+)` \| (`[\w`, ]+`) \| `Outcome", text, re.MULTILINE))
    assert {outcome: set(re.findall(r"`(\w+)`", states)) for outcome, states in rows.items()} == {
        outcome.value: {status.value for status in statuses}
        for outcome, statuses in WAYS_OUT.items()
    }
