"""The one error users see: the bottom of ptrun, imported by everything that checks input. How a run ends on it
(exit code 2, its one line) is `ptrun.train.run_end`'s, with every other way."""


class ConfigError(ValueError):
    """A user-facing configuration problem; its message is one line naming the key and what is allowed."""
