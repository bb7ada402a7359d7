"""The config error every startup check raises (:mod:`harness.launch.validate` and the tracking store's
record check in :mod:`harness.launch.tracking`); kept apart so that importing :mod:`harness.launch.tracking`
(as :mod:`analysis` does) does not import the whole config and model stack."""


class ConfigError(ValueError):
    """An invalid config value or combination; the message names the key(s)."""
