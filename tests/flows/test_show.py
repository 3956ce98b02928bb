"""`tandem show`'s transcripts: one-line turns as Python writes them, a conversation's
several lines as they read."""

from flows.show import transcript


def test_a_multi_line_turn_reads_as_written_and_a_short_one_as_python_writes_it():
    record = {"version": 2, "prompt_id": 5, "attempt": 0, "episode": 1, "reward": 1.0, "success": True,
              "prompt": "Mia has 37 marbles. How many?",
              "turns": [{"observation": "Mia has 37 marbles. How many?\nUse <calc>expression</calc>.",
                         "action": "<calc>37+48</calc>", "versions": [2]},
                        {"observation": "<result>85</result>", "action": "", "versions": []}]}
    assert transcript(record).splitlines() == [
        "v2 · prompt 5 (attempt 0) · episode 1 · reward 1.00 · success",
        "  prompt: 'Mia has 37 marbles. How many?'",
        "  env:    Mia has 37 marbles. How many?",
        "          Use <calc>expression</calc>.",
        "  agent:  '<calc>37+48</calc>'   (v2)",
        "  env:    '<result>85</result>'",
        "  agent:  ''",
    ]
