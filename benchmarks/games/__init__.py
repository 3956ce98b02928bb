"""Games the defaults are never tuned on: each tuning result is reported beside them
(README, "How a run ends"), so that a default that wins on the built-ins and collapses
elsewhere shows."""
