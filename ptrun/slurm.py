"""The job's layout from SLURM (`ptrun train` inside `srun`): the rules live with the config, in
`ptrun/config/slurm.py`, because resolving a config (`ptrun.compose.resolve`) applies them; this module is
their public name."""

from ptrun.config.slurm import *  # noqa: F401,F403
from ptrun.config.slurm import __all__  # noqa: F401
