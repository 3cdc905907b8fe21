"""What rlbench gives plugin authors (docs/plugins.md, "The public kit"). `API_VERSION` is the plugin
API's version (rlbench.kit.api: the MAJOR.MINOR rule, and how a plugin declares what it targets)."""

from rlbench.kit.api import API_VERSION, PluginAPIDeprecationWarning

__all__ = ["API_VERSION", "PluginAPIDeprecationWarning"]
