"""No password in anything printed (URL masking, the redactor, log records), and the one-line
wording of errors users cause (what, where, the fix)."""

from __future__ import annotations

import errno
import logging

import psycopg
import pymysql
import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

from snapshotter.common.errors import disk_error, explain, is_privilege_error
from snapshotter.common.redact import (
    MASK,
    RedactingFilter,
    Redactor,
    mask_text,
    mask_url,
    setting_secrets,
    url_secrets,
)
from snapshotter.sinks.spark.session import _delta_note
from snapshotter.sources.postgres.reader import (
    BUSY_GRACE_S,
    SILENT_S,
    SlotHolder,
    slot_holder_may_be_dying,
)

# --- masking --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:s3cret@h:5432/db", "postgresql://u:***@h:5432/db"),
        ("mysql://u:p%40ss@h/db", "mysql://u:***@h/db"),
        ("postgresql://h/db?password=s3cret&sslmode=require", "password=***&sslmode=require"),
        ("postgresql://u:s3cret@h:nope/db", "postgresql://u:***@h:nope/db"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
    ],
)
def test_mask_url(url: str, shown: str) -> None:
    masked = mask_url(url)
    assert shown in masked
    assert "s3cret" not in masked and "p%40ss" not in masked


_PASSWORD = st.text(
    alphabet=st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="@/:?#%"),
    min_size=3,
    max_size=20,
)


@settings(max_examples=200, deadline=None)
@given(_PASSWORD)
def test_a_password_never_survives_the_redactor(password: str) -> None:
    url = f"postgresql://someone:{password}@host:5432/db"
    redact = Redactor(url_secrets(url))
    for text in (
        url,
        f"error: cannot connect to {url}",
        f"connection failed: password={password} host=x",
        f"the server said {password!r}",
    ):
        assert password not in redact(text)


def test_a_password_equal_to_the_user_name_is_not_masked_everywhere() -> None:
    redact = Redactor(url_secrets("postgresql://snapshotter:snapshotter@h/db"))
    assert redact("run `snapshotter resume`") == "run `snapshotter resume`"
    assert redact("postgresql://snapshotter:snapshotter@h/db") == (
        "postgresql://snapshotter:***@h/db"
    )


def test_secret_settings() -> None:
    found = setting_secrets({"sasl_plain_password": "kpw123", "linger_ms": 5, "client_id": "c"})
    assert found == {"kpw123"}
    assert "kpw123" not in Redactor(found)("auth with kpw123 failed")


def test_the_example_placeholder_is_not_masked() -> None:
    assert mask_text("write it as mysql://USER:PASSWORD@HOST/DB") == (
        "write it as mysql://USER:PASSWORD@HOST/DB"
    )


def test_log_records_are_masked() -> None:
    redact = Redactor({"hunter22"})
    record = logging.LogRecord(
        "snapshotter.x", logging.ERROR, __file__, 1, "pw %s", ("hunter22",), None
    )
    assert RedactingFilter(redact).filter(record)
    assert record.getMessage() == f"pw {MASK}"


# --- errors ---------------------------------------------------------------------------------


def _wrapped(orig: BaseException, statement: str | None = None) -> sa.exc.DBAPIError:
    return sa.exc.OperationalError(statement, None, orig)  # type: ignore[arg-type]


def test_a_connection_failure_names_the_source_masked() -> None:
    exc = _wrapped(psycopg.OperationalError('connection to server at "h" failed: refused'))
    text = explain(exc, "postgresql://u:pw1234@h:5432/db").text
    assert text.startswith("cannot connect to the source at postgresql://u:***@h:5432/db:")
    assert "check source.url" in text and "pw1234" not in text


def test_a_mysql_privilege_error() -> None:
    exc = _wrapped(pymysql.err.OperationalError(1227, "Access denied; you need SUPER"), "SHOW X")
    assert is_privilege_error(exc)
    text = explain(exc, "mysql://u:pw1234@h/db").text
    assert "refused a privilege" in text and "(MySQL error 1227)" in text
    assert "(running: SHOW X)" in text and "grant it" in text


def test_a_postgres_privilege_error() -> None:
    orig = psycopg.errors.InsufficientPrivilege("permission denied for schema s")
    assert is_privilege_error(_wrapped(orig, "CREATE TABLE s.t ()"))


def test_disk_full_names_the_path_and_the_setting() -> None:
    text = disk_error(
        OSError(errno.ENOSPC, "No space left on device"),
        "/x/s.json",
        "the state file",
        "[state] dir",
    )
    assert text.startswith("no space left on the device holding the state file /x/s.json")
    assert "[state] dir" in text and "snapshotter resume" in text


def test_an_unexpected_error_says_how_to_see_more() -> None:
    explained = explain(KeyError("boom"))
    assert not explained.expected and explained.text == "KeyError: 'boom'"


def test_our_own_errors_are_said_as_they_are() -> None:
    from snapshotter.engine.state_store import StateLockedError

    explained = explain(StateLockedError("state x is in use by another snapshotter process"))
    assert explained.expected and explained.text.startswith("state x is in use")


# --- a slot another walsender holds ---------------------------------------------------------


def holder(last_reply: float | None, silent: float | None) -> SlotHolder:
    return SlotHolder(
        pid=1, application="snapshotter", client=None, last_reply=last_reply, silent_s=silent
    )


def test_the_first_seconds_are_always_waited() -> None:
    assert slot_holder_may_be_dying(holder(100.0, 0.0), 100.0, BUSY_GRACE_S - 0.1, 60)


def test_a_holder_that_replies_is_live() -> None:
    assert not slot_holder_may_be_dying(holder(100.0, 1.0), 100.0, BUSY_GRACE_S, 60)
    # silent for long when first seen, then replied: live
    assert not slot_holder_may_be_dying(holder(130.0, SILENT_S + 5), 100.0, 20, 60)


def test_a_silent_holder_is_waited_for_up_to_the_bound() -> None:
    silent = holder(100.0, SILENT_S + 1)
    assert slot_holder_may_be_dying(silent, 100.0, BUSY_GRACE_S + 1, 60)
    assert not slot_holder_may_be_dying(silent, 100.0, 60, 60)


def test_a_holder_that_cannot_be_told_is_said_after_the_grace() -> None:
    assert not slot_holder_may_be_dying(holder(None, None), None, BUSY_GRACE_S, 60)
    assert slot_holder_may_be_dying(None, None, BUSY_GRACE_S, 60)  # released meanwhile: retry


# --- the Spark start message ----------------------------------------------------------------


def test_the_spark_start_message_names_delta_only_when_used() -> None:
    assert _delta_note(required=True, loaded=True) == " with Delta Lake"
    assert "Delta" not in _delta_note(required=False, loaded=False)
    assert "provisioned" in _delta_note(required=False, loaded=True)


def test_the_spark_driver_logs_through_the_shipped_log4j_configuration_unless_debugging() -> None:
    from snapshotter.sinks.spark.session import LOG4J_CONFIG, driver_java_options

    assert LOG4J_CONFIG.is_file()
    text = LOG4J_CONFIG.read_text(encoding="utf-8")
    assert "rootLogger.level = warn" in text and "NativeCodeLoader" in text
    quiet = driver_java_options(local=True, debug=False)
    assert "-XX:TieredStopAtLevel=1" in quiet
    assert f"-Dlog4j2.configurationFile={LOG4J_CONFIG.as_uri()}" in quiet
    assert driver_java_options(local=True, debug=True) == "-XX:TieredStopAtLevel=1"
    assert driver_java_options(local=False, debug=True) == ""
    assert "log4j2" in driver_java_options(local=False, debug=False)
