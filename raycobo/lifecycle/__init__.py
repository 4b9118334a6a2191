"""The life cycle of one run: open the run directory, build the session, restore or
start, loop over rounds, finish (``experiment.py``); the loop (``loop.py``), the run
directory (``run_dir.py``), checkpoint files (``checkpoint.py``), atomic files
(``files.py``), callbacks and progress, and what a resumed directory is trusted with
(``trust.py``)."""

from raycobo.lifecycle.experiment import RunFailed, Terminated, resume_config, run_experiment
from raycobo.lifecycle.result import Result

__all__ = ["Result", "RunFailed", "Terminated", "resume_config", "run_experiment"]
