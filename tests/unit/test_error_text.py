"""A job's error is cut to what nq_job.last_error holds: bytes of UTF-8, not characters."""

from notifyq.store import queries


def test_an_error_longer_than_the_column_is_cut_by_bytes_on_a_character_boundary():
    # Given 30,000 three-byte characters (90,000 bytes) and four-byte ones
    # When cut for the column, or for a limit that falls inside a character
    # Then the result is at most the limit in UTF-8 and ends on a whole character
    assert len(queries.error_text("\u6f22" * 30000).encode()) == 65535
    assert queries.error_text("ab\u6f22", 4) == "ab"
    assert queries.error_text("\U0001f600" * 3, 9) == "\U0001f600" * 2


def test_lone_surrogates_become_question_marks_and_short_errors_stay_as_they_are():
    assert queries.error_text("\ud800 x \udfff") == "? x ?"
    assert queries.error_text("ValueError: bad input") == "ValueError: bad input"
