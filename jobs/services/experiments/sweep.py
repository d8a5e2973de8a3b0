"""The console worker's experiment sweep: on a timer, judge every running trial and advance
every active experiment. The hints (a trial's job ended, its objective archived) do this at
once; the sweep is what makes a hint lost with a killed console worker cost only a delay."""

from jobs.services.experiments import driver
from jobs.services.periodic import PeriodicPass


class ExperimentSweep(PeriodicPass[int]):
    what = "experiment sweep"
    # A console worker killed with a trial's judgement in hand loses it for the broker's
    # visibility timeout (an hour: Redis redelivers an unacknowledged task only then): its
    # successor judges at once, not a sweep's interval later, while the trial trains on.
    pass_at_start = True

    def one_pass(self) -> int:
        return driver.sweep()
