"""The config error every startup check raises (:mod:`harness.validate` and the tracking store's
record check in :mod:`harness.tracking`); kept apart so that importing :mod:`harness.tracking`
(as :mod:`analysis` does) does not import the whole config and model stack."""


class ConfigError(ValueError):
    """An invalid config value or combination; the message names the key(s)."""
