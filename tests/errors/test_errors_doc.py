"""docs/errors.md lists at least 40 bad inputs, and a test in this folder triggers each one."""

import pathlib
import re

THIS = pathlib.Path(__file__).resolve()


def test_the_table_has_forty_rows_each_tested(rows):
    assert len(rows) >= 40, f"docs/errors.md lists {len(rows)} bad inputs; the issue asks for 40"
    tests = [p for p in THIS.parent.glob("test_*.py") if p != THIS]
    tested = set(re.findall(r'"([A-Z]\d\d)"', "".join(p.read_text() for p in tests)))
    assert not sorted(set(rows) - tested), f"rows without a test: {sorted(set(rows) - tested)}"
    assert not sorted(tested - set(rows)), f"tests of rows not in the table: {tested - set(rows)}"


def test_every_row_says_what_the_input_was_and_the_fix(rows):
    for row in rows.values():
        assert row.input.strip() and row.fix.strip(), row.id
