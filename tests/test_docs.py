"""The docs describe the code: a state or a setting missing from them fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

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


def test_the_readme_documents_every_setting() -> None:
    readme = read("README.md")
    settings = sorted(name[len("DEFAULT_"):] for name in vars(conf) if name.startswith("DEFAULT_"))
    missing = [name for name in settings if f"PGJOBS_{name}" not in readme]
    assert missing == []


def test_ci_runs_the_readme_test_command_as_written_and_against_the_machine_server() -> None:
    assert "make test   # the whole test suite" in read("README.md")
    legs = [line for line in read(".ci/run").splitlines()
            if re.search(r"\bmake test\b", line) and not line.lstrip().startswith(("#", "leg "))]
    # One leg exactly as a newcomer runs it (no DATABASE_URL: the embedded server), one against
    # the machine's server.
    assert legs[0].split(">")[0].rstrip() == "env -u DATABASE_URL make test"
    assert legs[1].startswith("DATABASE_URL=$MACHINE_DATABASE_URL make test ")
    assert len(legs) == 2


@pytest.mark.django_db
def test_the_claim_path_doc_shows_the_claim_statement_as_it_is_sent() -> None:
    from django_pgjobs.transitions import claim_statement

    text = read("docs/claim-path.md")
    block = text.split("```sql\n", 1)[1].split("\n```", 1)[0]
    # Django 6 quotes the ORM's subquery aliases ("U0"), Django 5.2 does not (U0).
    def unquoted(sql: str) -> str:
        return re.sub(r'"(U\d+)"', r"\1", sql)

    assert unquoted(block) == unquoted(claim_statement(10).rstrip("\n"))


def test_the_state_machine_doc_lists_the_ways_out_of_running() -> None:
    from django_pgjobs.outcomes import WAYS_OUT

    text = read("docs/state-machine.md")
    rows = dict(re.findall(r"^\| `(\w+)` \| (`[\w`, ]+`) \| `Outcome", text, re.MULTILINE))
    assert {outcome: set(re.findall(r"`(\w+)`", states)) for outcome, states in rows.items()} == {
        outcome.value: {status.value for status in statuses}
        for outcome, statuses in WAYS_OUT.items()
    }
