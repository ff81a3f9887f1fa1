"""Machine-noise guard: tracebacks, heartbeat and cron lines are recognised; human text is left alone."""

import pytest

from nemori_dspy.noise import NOISE_MARK, is_noise_insight, strip_noise

TRACEBACK = """Traceback (most recent call last):
  File "/app/worker.py", line 12, in <module>
    main()
  File "/app/worker.py", line 8, in main
    total = int(row["n"])
KeyError: 'n'"""


@pytest.mark.parametrize("text", [
    TRACEBACK,
    TRACEBACK + "\n\nDuring handling of the above exception, another exception occurred:\n\n" + TRACEBACK,
    "[heartbeat] ok",
    "HEARTBEAT seq=42 ts=1684920000",
    "keepalive 17",
    "health-check: ok",
    "May 24 10:00:01 host CRON[1234]: (root) CMD (/usr/local/bin/backup.sh)",
    "*/5 * * * * /usr/bin/sync --quiet",
    '  File "/app/worker.py", line 12, in <module>',
])
def test_machine_output_is_removed_entirely(text):
    assert strip_noise(text) == ""


@pytest.mark.parametrize("text", [
    "My heartbeat is racing before the exam.",
    "Ping me tomorrow about the pottery class!",
    "I got a KeyError in my homework script yesterday, so frustrating.",
    "We meet every 5 minutes * 3 rounds.",
    "Healthcheck appointment went fine, the doctor says I'm ok.",
])
def test_human_text_is_left_unchanged(text):
    assert strip_noise(text) == text and not is_noise_insight(text)


def test_a_traceback_inside_human_text_is_replaced_by_a_mark():
    text = "My script crashed again:\n" + TRACEBACK + "\nCan you help? I'm Alice, by the way."
    assert strip_noise(text) == f"My script crashed again:\n{NOISE_MARK}\nCan you help? I'm Alice, by the way."


@pytest.mark.parametrize("insight", [
    "KeyError: 'n'",
    'The user saw File "/app/worker.py", line 12, in <module>',
    "Traceback (most recent call last): the worker failed.",
    "[heartbeat] ok",
])
def test_insights_quoting_machine_output_are_noise(insight):
    assert is_noise_insight(insight)
