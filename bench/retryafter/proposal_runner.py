"""`python -m runner` with a `Retry-After` policy from `policies.py` (an experiment).

    RETRYAFTER_POLICY=proposal python -m bench.retryafter.proposal_runner

Same environment as `python -m runner`, plus `RETRYAFTER_POLICY` (a name in
`policies.POLICIES`). The scheduler core the runner builds is replaced by
`experiment.scheduler_with(policy)`; with the `proposal` policy the rate limiter's 429s
also spread a tenant's refused clients (`experiment.install_rate_limit_spread`).
Everything else is the runner as it is (from the directory it runs in, so `--ref`
picks the runner's code).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import runner.scheduler.admission
from bench.retryafter import policies
from bench.retryafter.experiment import install_rate_limit_spread, scheduler_with
from runner.runtime.cli import main


def run() -> Any:
    name = os.environ.get("RETRYAFTER_POLICY", "proposal")
    policy = policies.POLICIES[name]
    if name == "proposal":
        install_rate_limit_spread(time.monotonic)
    # an experiment, not the runner: the core SchedulerAdmission builds is ours
    setattr(runner.scheduler.admission, "Scheduler", scheduler_with(policy))  # noqa: B010
    return main(["serve"])


if __name__ == "__main__":
    sys.exit(run())
