"""Reference plugins that speak NVSentinel's plugin contracts."""
